//! The one place a unit's end reaches the engine's caller, as nextest's
//! dispatcher alone talks to its reporter. A unit ends in one of several
//! places (the entry points for units decided before any worker, the Keras
//! stage for a failed export, a slot's loop, a slot's reaper), and each of
//! them sends its report here: this is where "every unit ends exactly once"
//! is kept (a second end of a unit is dropped, and a debug build stops on
//! it) and where a Keras file's unit gets its export report.

use crate::event::Event;
use crate::keras::report::ExportReport;
use std::sync::Mutex;

/// Passes a run's events on to the caller's `on_event`, each unit's end once.
pub(crate) struct Dispatcher<'a> {
    on_event: &'a mut dyn FnMut(Event),
    /// How each Keras file's unit got its SavedModel, taken into its report
    /// when it ends (filled by the Keras stage as exports end).
    exports: &'a Mutex<Vec<Option<ExportReport>>>,
    /// Which of the run's units have ended.
    ended: Vec<bool>,
}

impl<'a> Dispatcher<'a> {
    pub fn new(
        units: usize,
        exports: &'a Mutex<Vec<Option<ExportReport>>>,
        on_event: &'a mut dyn FnMut(Event),
    ) -> Dispatcher<'a> {
        Dispatcher { on_event, exports, ended: vec![false; units] }
    }

    /// Tells the caller `event`: a unit's start as it comes, a unit's end
    /// only the first time (with its export report, if it has one).
    pub fn send(&mut self, event: Event) {
        match event {
            Event::Finished(mut report) => {
                let index = report.index;
                match self.ended.get_mut(index) {
                    Some(ended) if !*ended => *ended = true,
                    _ => {
                        tracing::error!(unit = index, "a unit ended twice, or is not one of the run's: dropped");
                        debug_assert!(false, "unit {index} ended twice, or is not one of the run's");
                        return;
                    }
                }
                if report.export.is_none() {
                    report.export = self.exports.lock().expect("exports")[index].take();
                }
                (self.on_event)(Event::Finished(report));
            }
            other => (self.on_event)(other),
        }
    }

    /// After the run: every unit has ended (logged, and a debug build
    /// stops, where one has not).
    pub fn finish(self) {
        let missing: Vec<usize> = self.ended.iter().enumerate().filter(|(_, &ended)| !ended).map(|(i, _)| i).collect();
        if !missing.is_empty() {
            tracing::error!(?missing, "units never ended");
            debug_assert!(false, "units {missing:?} never ended");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Dispatcher;
    use crate::event::Event;
    use crate::unit::UnitReport;
    use isorun_protocol::Outcome;
    use std::sync::Mutex;

    #[test]
    fn each_unit_reaches_the_caller_once_with_its_export_report() {
        let exports = Mutex::new(vec![None, None]);
        let mut seen = Vec::new();
        let mut on_event = |event| seen.push(event);
        let mut dispatcher = Dispatcher::new(2, &exports, &mut on_event);
        dispatcher.send(Event::Started(1));
        dispatcher.send(Event::Finished(Box::new(UnitReport::new(1, Outcome::Ok))));
        dispatcher.send(Event::Finished(Box::new(UnitReport::new(0, Outcome::Ok))));
        dispatcher.finish();
        let ended: Vec<usize> = seen
            .iter()
            .filter_map(|e| match e {
                Event::Finished(report) => Some(report.index),
                Event::Started(_) => None,
            })
            .collect();
        assert_eq!(ended, vec![1, 0]);
    }

    #[test]
    #[should_panic(expected = "unit 0 ended twice")]
    fn a_second_end_of_a_unit_is_refused() {
        let exports = Mutex::new(vec![None]);
        let mut on_event = |_| {};
        let mut dispatcher = Dispatcher::new(1, &exports, &mut on_event);
        dispatcher.send(Event::Finished(Box::new(UnitReport::new(0, Outcome::Ok))));
        dispatcher.send(Event::Finished(Box::new(UnitReport::new(0, Outcome::Ok))));
    }
}
