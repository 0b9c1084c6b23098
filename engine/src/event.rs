//! The events the engine tells its caller as a run goes on. A leaf of its
//! own because they are sent from several places (the engine's entry
//! points, the executor, the Keras stage): each of those imports this
//! file, not the module of another sender.

use crate::unit::UnitReport;

/// What the engine tells its caller as a run goes on.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event {
    /// The unit (index into the models given to
    /// [`Engine::run`](crate::Engine::run)) was handed to a worker. A
    /// retried unit starts more than once.
    Started(usize),
    /// A unit ended, for good; in any order, exactly once per unit.
    Finished(Box<UnitReport>),
}
