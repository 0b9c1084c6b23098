//! The vocabulary every other module of the crate shares: the metrics by
//! name and the tasks. A leaf, so the metric state (`state`) and the
//! evaluator (`metrics`) both use it without importing each other.

/// A metric name of the fixed vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    Accuracy,
    TopKAccuracy,
    Auc,
    PrAuc,
    LogLoss,
    Precision,
    Recall,
    F1,
    Mse,
    Mae,
    Rmse,
    MeanPrediction,
    MeanLabel,
    /// mean_prediction / mean_label.
    Calibration,
    /// Coefficient of determination.
    R2,
    /// Expected calibration error of the top class (see `calibration`).
    Ece,
    /// Brier score: mean squared error of the probabilities against the one-hot label.
    Brier,
}

impl Metric {
    /// Every metric, in the vocabulary's order.
    pub const ALL: [Metric; 17] = [
        Metric::Accuracy,
        Metric::TopKAccuracy,
        Metric::Auc,
        Metric::PrAuc,
        Metric::LogLoss,
        Metric::Precision,
        Metric::Recall,
        Metric::F1,
        Metric::Mse,
        Metric::Mae,
        Metric::Rmse,
        Metric::MeanPrediction,
        Metric::MeanLabel,
        Metric::Calibration,
        Metric::R2,
        Metric::Ece,
        Metric::Brier,
    ];

    /// Common other names of metrics (Keras's and scikit-learn's), taken as the metric.
    pub const ALIASES: [(&'static str, Metric); 9] = [
        ("acc", Metric::Accuracy),
        ("roc_auc", Metric::Auc),
        ("logloss", Metric::LogLoss),
        ("cross_entropy", Metric::LogLoss),
        ("mean_squared_error", Metric::Mse),
        ("mean_absolute_error", Metric::Mae),
        ("expected_calibration_error", Metric::Ece),
        ("brier_score", Metric::Brier),
        ("brier_score_loss", Metric::Brier),
    ];

    /// The metric of a name (or of an alias: `acc`, `roc_auc`, `logloss`);
    /// an unknown name's error lists the vocabulary
    /// and the closest name.
    pub fn parse(name: &str) -> Result<Metric, String> {
        let wanted = name.trim().to_ascii_lowercase().replace('-', "_");
        if let Some(m) = Metric::ALL.into_iter().find(|m| m.name() == wanted) {
            return Ok(m);
        }
        if let Some((_, m)) = Metric::ALIASES.iter().find(|(alias, _)| *alias == wanted) {
            return Ok(*m);
        }
        let names: Vec<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
        // A name the user began (`acc`, `prec`) before one a few edits away.
        let prefixed: Vec<&str> =
            names.iter().copied().filter(|n| !wanted.is_empty() && n.starts_with(&wanted)).collect();
        let closest = match prefixed[..] {
            [one] => Some(one),
            _ => names
                .iter()
                .map(|n| (strsim::levenshtein(&wanted, n), *n))
                .min()
                .filter(|(d, _)| *d <= 3)
                .map(|(_, n)| n),
        };
        let hint = closest.map_or(String::new(), |n| format!(" (did you mean '{n}'?)"));
        Err(format!("unknown metric '{name}'{hint}; metrics are: {}", names.join(", ")))
    }

    /// The name in the vocabulary (and in reports).
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::TopKAccuracy => "top_k_accuracy",
            Metric::Auc => "auc",
            Metric::PrAuc => "pr_auc",
            Metric::LogLoss => "log_loss",
            Metric::Precision => "precision",
            Metric::Recall => "recall",
            Metric::F1 => "f1",
            Metric::Mse => "mse",
            Metric::Mae => "mae",
            Metric::Rmse => "rmse",
            Metric::MeanPrediction => "mean_prediction",
            Metric::MeanLabel => "mean_label",
            Metric::Calibration => "calibration",
            Metric::R2 => "r2",
            Metric::Ece => "ece",
            Metric::Brier => "brier",
        }
    }

    /// False for losses and errors (log_loss, mse, mae, rmse, ece, brier). mean_prediction,
    /// mean_label and calibration have no better direction and count as
    /// higher-is-better for bounds and drops.
    pub fn higher_is_better(&self) -> bool {
        !matches!(self, Metric::LogLoss | Metric::Mse | Metric::Mae | Metric::Rmse | Metric::Ece | Metric::Brier)
    }

    /// Whether the metric applies to a task.
    pub fn applies_to(&self, task: Task) -> bool {
        use Metric::*;
        match task {
            Task::Binary => !matches!(self, TopKAccuracy | R2),
            Task::Multiclass { .. } => {
                matches!(self, Accuracy | TopKAccuracy | Auc | PrAuc | LogLoss | Precision | Recall | F1 | Ece | Brier)
            }
            Task::Regression => matches!(self, Mse | Mae | Rmse | R2 | MeanPrediction | MeanLabel | Calibration),
        }
    }
}

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What kind of problem the model solves, as decided from the first batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Binary,
    Multiclass { classes: usize },
    Regression,
}

impl Task {
    /// `binary`, `multiclass` or `regression`.
    pub fn name(&self) -> &'static str {
        match self {
            Task::Binary => "binary",
            Task::Multiclass { .. } => "multiclass",
            Task::Regression => "regression",
        }
    }

    /// The metrics used when none are asked for.
    pub fn default_metrics(&self, top_k: usize) -> Vec<Metric> {
        use Metric::*;
        match self {
            Task::Binary => vec![Accuracy, Auc, LogLoss, Precision, Recall, F1],
            Task::Multiclass { classes } if *classes > top_k => vec![Accuracy, TopKAccuracy, LogLoss],
            Task::Multiclass { .. } => vec![Accuracy, LogLoss],
            Task::Regression => vec![Mse, Mae, Rmse],
        }
    }
}
