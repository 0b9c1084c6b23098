//! The JSON line of one model: keys that do not apply are left out (never
//! `null`), dtypes use the one vocabulary, times are milliseconds. The same
//! record goes to stdout, the journal and the reports.

use isorun_engine::keras::ExportCheck;
use isorun_engine::{Attempt, Model, StreamReport, UnitReport};
use isorun_protocol::{signal_name, Breach, Outcome};
use serde_json::{json, Map, Value};

/// The record of one model's unit.
pub fn unit_record(model: &Model, report: &UnitReport) -> Value {
    let mut r = Map::new();
    r.insert("model".into(), json!(model.id));
    r.insert("path".into(), json!(model.path.to_string_lossy()));
    r.insert("status".into(), json!(report.outcome.status()));
    // A fed unit (eval) keeps metrics, not outputs.
    if report.outcome.is_ok() && report.stream.is_none() {
        let mut outputs = Map::new();
        for output in &report.outputs {
            let mut o = Map::new();
            o.insert("dtype".into(), json!(output.dtype.name()));
            o.insert("shape".into(), json!(output.shape));
            if let Some(values) = &output.values {
                o.insert("values".into(), values.clone());
            }
            outputs.insert(output.name.clone(), Value::Object(o));
        }
        r.insert("outputs".into(), Value::Object(outputs));
    }
    outcome_fields(&mut r, &report.outcome);
    if let Some(stream) = &report.stream {
        stream_fields(&mut r, stream);
    }
    if let Some(export) = &report.export {
        let mut e = Map::new();
        e.insert("from".into(), json!(export.from.name()));
        e.insert("cached".into(), json!(export.cached));
        e.insert("ms".into(), json!(export.ms));
        if let Some(loader) = &export.loader {
            e.insert("loader".into(), json!(loader));
        }
        if let Some(graph) = export.graph {
            e.insert("graph".into(), json!(graph.name()));
        }
        if let Some(check) = &export.check {
            e.insert("check".into(), json!(check.name()));
            match check {
                ExportCheck::Worker { ms: Some(ms) } => {
                    e.insert("check_ms".into(), json!(ms));
                }
                ExportCheck::Failed { why } => {
                    e.insert("check_error".into(), json!(why));
                }
                _ => {}
            }
        }
        for (key, phases) in [("phases_ms", &export.phases_ms), ("before_ms", &export.before_ms)] {
            if !phases.is_empty() {
                e.insert(key.into(), Value::Object(phases.iter().map(|(k, ms)| (k.clone(), json!(ms))).collect()));
            }
        }
        r.insert("export".into(), Value::Object(e));
    }
    if !report.casts.is_empty() {
        // Inputs cast to the signature's dtypes (`--strict-dtypes` refuses instead).
        let casts: serde_json::Map<String, Value> =
            report.casts.iter().map(|(name, cast)| (name.clone(), json!(cast))).collect();
        r.insert("cast".into(), Value::Object(casts));
    }
    r.insert("wall_ms".into(), json!(report.wall.as_millis() as u64));
    if let Some(ms) = report.load_ms {
        r.insert("load_ms".into(), json!(ms));
    }
    if let Some(ms) = report.run_ms {
        r.insert("run_ms".into(), json!(ms));
    }
    if let Some(user) = report.user {
        r.insert("user_ms".into(), json!(user.as_millis() as u64));
    }
    if let Some(system) = report.system {
        r.insert("sys_ms".into(), json!(system.as_millis() as u64));
    }
    if let Some(bytes) = report.peak_rss_bytes {
        r.insert("peak_rss_bytes".into(), json!(bytes));
    }
    if let Some(phases) = &report.phases {
        r.insert("phases_ms".into(), phases_record(report, phases));
    }
    if let Some(id) = report.worker_id {
        r.insert("worker_id".into(), json!(id));
    }
    if let Some(forked) = report.worker_forked {
        r.insert("worker_start".into(), json!(if forked { "fork" } else { "exec" }));
    }
    // An ONNX model that reached a worker: the ONNX Runtime it ran with, and
    // the execution provider its session was made with (once it loaded).
    if model.format == isorun_engine::ModelFormat::Onnx && report.worker_id.is_some() {
        if let Ok(found) = isorun_engine::onnxruntime() {
            let mut fields = json!({"version": found.version, "library": found.library.to_string_lossy()});
            if let Some(session) = &report.onnx {
                fields["execution_provider"] = json!(session.execution_provider.name());
                if let Some(error) = &session.cuda_error {
                    fields["cuda_error"] = json!(error);
                }
            }
            r.insert("onnxruntime".into(), fields);
        }
    }
    if let Some(spare) = &report.spare {
        let mut fields = json!({"warm_ms": spare.warm_ms, "waited_ms": spare.waited_ms});
        if let Some(error) = &spare.warm_error {
            fields["warm_error"] = json!(error);
        }
        if let Some(preloaded) = &spare.preloaded {
            fields["preload_ms"] = json!(preloaded.load_ms);
        }
        r.insert("spare".into(), fields);
    }
    gpu_fields(&mut r, report);
    if !report.attempts.is_empty() {
        r.insert("attempts".into(), Value::Array(report.attempts.iter().map(attempt_record).collect()));
    }
    if let Some((protections, missing)) = &report.sandbox {
        r.insert("sandbox".into(), json!(protections));
        if !missing.is_empty() {
            r.insert("sandbox_missing".into(), json!(missing));
        }
    }
    if report.worker_unreaped {
        // Killed, but not gone within the reap timeout: a process stuck in the kernel.
        r.insert("worker_unreaped".into(), json!(true));
    }
    if report.flaky() {
        r.insert("flaky".into(), json!(true));
    }
    if !report.outcome.is_ok() && !report.stderr_tail.is_empty() {
        r.insert("stderr_tail".into(), json!(report.stderr_tail));
    }
    Value::Object(r)
}

/// Milliseconds, to the microsecond.
fn ms(d: std::time::Duration) -> Value {
    json!(d.as_micros() as f64 / 1000.0)
}

/// `"phases_ms"`: where the unit's wall time went. `spawn`, `hello`,
/// `sandbox` (and its `sandbox_steps`) when its worker was started for it;
/// `load` (0 when its spare loaded the model ahead: `spare.preload_ms`) and
/// `run` as the worker timed them; `ipc` the requests' round
/// trips less the worker's sandbox, load and run; `data` and `score` for a
/// fed unit (the slot's wait for the next decoded batch, and its wait on
/// scoring: `eval` scores each batch on a thread beside the worker, so
/// `score` is the time the slot waited for room in that thread's queue of
/// two batches and, at the end, for the last ones to be scored), with
/// `data_decode` beside them (the decoding done on the prefetch thread while
/// the worker ran: overlapped, not one of `wall_ms`'s parts, as
/// `spare_wait`); `spare_wait` (the wait
/// for its spare to finish warming up, before the unit's `wall_ms` began:
/// not one of its parts); `exit`
/// (asking the worker to leave until it is reaped, for the last unit of a
/// worker; after a passed unit the slot's reaper does it while the next
/// unit starts); `other` the rest of `wall_ms`.
fn phases_record(report: &UnitReport, phases: &isorun_engine::Phases) -> Value {
    use std::time::Duration;
    let mut p = Map::new();
    let sandbox: Duration = phases.sandbox.iter().map(|(_, d)| *d).sum();
    // A model its spare loaded ahead (`spare.preload_ms`) took none of the unit's wall time.
    let preloaded = report.spare.as_ref().is_some_and(|s| s.preloaded.is_some());
    let load = Duration::from_millis(if preloaded { 0 } else { report.load_ms.unwrap_or(0) });
    // The worker's own microseconds, summed; a record without them, its milliseconds.
    let run = if phases.run > Duration::ZERO { phases.run } else { Duration::from_millis(report.run_ms.unwrap_or(0)) };
    let spare_wait = Duration::from_millis(report.spare.as_ref().map_or(0, |s| s.waited_ms));
    let ipc = phases.requests.saturating_sub(sandbox + load + run);
    let mut accounted = phases.requests;
    if let Some(spawn) = phases.spawn {
        p.insert("spawn".into(), ms(spawn));
        accounted += spawn;
    }
    if let Some(hello) = phases.hello {
        p.insert("hello".into(), ms(hello));
        accounted += hello;
    }
    if !phases.sandbox.is_empty() {
        p.insert("sandbox".into(), ms(sandbox));
        let steps: Map<String, Value> = phases.sandbox.iter().map(|(name, d)| (name.clone(), ms(*d))).collect();
        p.insert("sandbox_steps".into(), Value::Object(steps));
    }
    p.insert("load".into(), ms(load));
    p.insert("run".into(), ms(run));
    p.insert("ipc".into(), ms(ipc));
    if report.stream.is_some() {
        p.insert("data".into(), ms(phases.feed_next));
        p.insert("score".into(), ms(phases.feed_accept));
        accounted += phases.feed_next + phases.feed_accept;
        // Decoded on the prefetch thread while the worker ran: beside the wall time, not in it.
        p.insert("data_decode".into(), ms(phases.feed_background));
    }
    if report.spare.is_some() {
        p.insert("spare_wait".into(), ms(spare_wait));
    }
    if let Some(exit) = phases.exit {
        p.insert("exit".into(), ms(exit));
        accounted += exit;
    }
    p.insert("other".into(), ms(report.wall.saturating_sub(accounted)));
    Value::Object(p)
}

/// A fed unit (`isorun eval`): how many examples went through, how fast,
/// and what the feed made of them (`metrics`, `slices`, ...).
fn stream_fields(r: &mut Map<String, Value>, stream: &StreamReport) {
    r.insert("examples".into(), json!(stream.examples));
    for (key, value) in &stream.fields {
        r.insert(key.clone(), value.clone());
    }
    r.insert("batches".into(), json!(stream.batches));
    if let Some(rate) = stream.examples_per_second {
        r.insert("examples_per_second".into(), json!(round3(rate)));
    }
    if let Some([p50, p90, p99]) = stream.latency_ms {
        r.insert("batch_latency_ms".into(), json!({"p50": round3(p50), "p90": round3(p90), "p99": round3(p99)}));
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The unit's device (`--gpus` only) and, where NVML measured them, the
/// worker's peak GPU memory and what the device got back at its exit.
fn gpu_fields(r: &mut Map<String, Value>, report: &UnitReport) {
    if let Some(gpu) = &report.gpu {
        r.insert("gpu".into(), json!(gpu));
    }
    if let Some(bytes) = report.gpu_peak_bytes {
        r.insert("gpu_peak_bytes".into(), json!(bytes));
    }
    if let Some(back) = report.gpu_return {
        r.insert("gpu_returned_bytes".into(), json!(back.returned_bytes));
        r.insert("gpu_used_after_bytes".into(), json!(back.used_after_bytes));
    }
}

/// One attempt: how it ended, how long it took, how much memory.
fn attempt_record(attempt: &Attempt) -> Value {
    let mut a = Map::new();
    a.insert("status".into(), json!(attempt.outcome.status()));
    outcome_fields(&mut a, &attempt.outcome);
    a.insert("wall_ms".into(), json!(attempt.wall.as_millis() as u64));
    if let Some(bytes) = attempt.peak_rss_bytes {
        a.insert("peak_rss_bytes".into(), json!(bytes));
    }
    if let Some(id) = attempt.worker_id {
        a.insert("worker_id".into(), json!(id));
    }
    if attempt.shared_worker {
        a.insert("shared_worker".into(), json!(true));
    }
    Value::Object(a)
}

/// `error` and the fields particular to an outcome (`signal`, `phase`, ...).
pub fn outcome_fields(r: &mut Map<String, Value>, outcome: &Outcome) {
    match outcome {
        Outcome::Ok => {}
        Outcome::Error(e) => {
            let mut error = Map::new();
            error.insert("kind".into(), json!(e.kind.name()));
            if let Some(code) = &e.code {
                error.insert("code".into(), json!(code));
            }
            error.insert("message".into(), json!(e.message));
            r.insert("error".into(), Value::Object(error));
        }
        other => {
            r.insert("error".into(), json!({ "kind": other.status(), "message": other.to_string() }));
        }
    }
    match outcome {
        Outcome::Crashed { signal, core_dumped, exit_code } => {
            if let Some(signal) = signal {
                r.insert("signal".into(), json!(signal));
                r.insert("signal_name".into(), json!(signal_name(*signal)));
                r.insert("core_dumped".into(), json!(core_dumped));
            }
            if let Some(code) = exit_code {
                r.insert("exit_code".into(), json!(code));
            }
        }
        Outcome::Timeout { phase } => {
            r.insert("phase".into(), json!(phase.name()));
        }
        Outcome::NotRun { reason } => {
            r.insert("reason".into(), json!(reason.name()));
        }
        Outcome::MemoryLimit { peak_bytes } => {
            r.insert("peak_private_bytes".into(), json!(peak_bytes));
        }
        Outcome::Mismatch { output, max_abs_error, max_rel_error, index, .. } => {
            let mut m = Map::new();
            m.insert("output".into(), json!(output));
            if let Some(e) = max_abs_error {
                m.insert("max_abs_error".into(), json!(e));
            }
            if let Some(e) = max_rel_error {
                m.insert("max_rel_error".into(), json!(if e.is_finite() { json!(e) } else { json!("Infinity") }));
            }
            if let Some(index) = index {
                m.insert("index".into(), json!(index));
            }
            r.insert("mismatch".into(), Value::Object(m));
        }
        Outcome::BelowThreshold { metric, rule, bound, value, baseline, others } => {
            // `breach` is the first (the outcome's), `breaches` every one, the first first.
            let first = Breach {
                metric: metric.clone(),
                rule: rule.clone(),
                bound: *bound,
                value: *value,
                baseline: *baseline,
            };
            r.insert("breach".into(), breach_json(&first));
            let all = std::iter::once(&first).chain(others).map(breach_json).collect();
            r.insert("breaches".into(), Value::Array(all));
        }
        _ => {}
    }
}

/// `{"metric", "rule", "bound", "value"[, "baseline"]}`.
fn breach_json(breach: &Breach) -> Value {
    let mut b = Map::new();
    b.insert("metric".into(), json!(breach.metric));
    b.insert("rule".into(), json!(breach.rule));
    b.insert("bound".into(), json!(breach.bound));
    b.insert("value".into(), json!(breach.value));
    if let Some(baseline) = breach.baseline {
        b.insert("baseline".into(), json!(baseline));
    }
    Value::Object(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_engine::gpus::GpuReturn;
    use std::path::PathBuf;

    fn model() -> Model {
        Model::saved_model("m", PathBuf::from("/models/m"))
    }

    fn gpu_keys(record: &Value) -> Vec<&str> {
        record.as_object().unwrap().keys().map(String::as_str).filter(|k| k.starts_with("gpu")).collect()
    }

    #[test]
    fn every_breach_is_in_breaches_and_the_first_is_breach() {
        let breach = |rule: &str, baseline| Breach {
            metric: "accuracy".into(),
            rule: rule.into(),
            bound: 0.9,
            value: 0.5,
            baseline,
        };
        let breaches = vec![breach("accuracy>=0.9", None), breach("max drop accuracy=0.01", Some(0.91))];
        let outcome = Outcome::below_threshold(breaches).unwrap();
        let record = unit_record(&model(), &UnitReport::new(0, outcome));
        assert_eq!(
            record["breach"],
            json!({"metric": "accuracy", "rule": "accuracy>=0.9", "bound": 0.9, "value": 0.5})
        );
        assert_eq!(record["breaches"][0], record["breach"]);
        assert_eq!(record["breaches"][1]["rule"], "max drop accuracy=0.01");
        assert_eq!(record["breaches"][1]["baseline"], 0.91);
        assert_eq!(record["breaches"].as_array().unwrap().len(), 2);
        assert!(Outcome::below_threshold(Vec::new()).is_none());
    }

    #[test]
    fn without_gpus_or_nvml_a_record_has_no_gpu_fields() {
        let report = UnitReport::new(0, Outcome::Ok);
        assert!(gpu_keys(&unit_record(&model(), &report)).is_empty());
        // --gpus without NVML: the device, and nothing measured.
        let mut report = UnitReport::new(0, Outcome::Ok);
        report.gpu = Some("0".into());
        let record = unit_record(&model(), &report);
        assert_eq!(gpu_keys(&record), ["gpu"]);
        assert_eq!(record["gpu"], "0");
    }

    #[test]
    fn measured_gpu_memory_is_in_the_record() {
        let mut report = UnitReport::new(0, Outcome::Ok);
        report.gpu = Some("GPU-1234".into());
        report.gpu_peak_bytes = Some(10 << 30);
        report.gpu_return = Some(GpuReturn { returned_bytes: 10 << 30, used_after_bytes: 600 << 20 });
        let record = unit_record(&model(), &report);
        assert_eq!(gpu_keys(&record), ["gpu", "gpu_peak_bytes", "gpu_returned_bytes", "gpu_used_after_bytes"]);
        assert_eq!(record["gpu_peak_bytes"], 10u64 << 30);
        assert_eq!(record["gpu_used_after_bytes"], 600u64 << 20);
    }

    /// A fed unit's parts add up to its wall time; the decoding that
    /// overlapped the worker (`data_decode`) is beside them, not one of them.
    #[test]
    fn a_fed_unit_s_phases_add_up_to_its_wall_time_with_the_overlapped_decoding_beside() {
        let ms = std::time::Duration::from_millis;
        let mut report = UnitReport::new(0, Outcome::Ok);
        report.wall = ms(1000);
        report.load_ms = Some(100);
        report.stream = Some(isorun_engine::StreamReport::default());
        report.phases = Some(isorun_engine::Phases {
            spawn: Some(ms(50)),
            hello: Some(ms(30)),
            requests: ms(600),
            run: ms(400),
            feed_next: ms(20),
            feed_accept: ms(40),
            feed_background: ms(350),
            exit: Some(ms(10)),
            ..Default::default()
        });
        let record = unit_record(&model(), &report);
        let phases = record["phases_ms"].as_object().unwrap();
        let part = |key: &str| phases[key].as_f64().unwrap();
        assert_eq!(part("data"), 20.0, "the slot's wait for a decoded batch");
        assert_eq!(part("data_decode"), 350.0, "the decoding beside it");
        assert_eq!(part("ipc"), 100.0);
        let parts = ["spawn", "hello", "load", "run", "ipc", "data", "score", "exit", "other"];
        let sum: f64 = parts.iter().map(|k| part(k)).sum();
        assert_eq!(sum, 1000.0, "{phases:?}");
        let named: Vec<&str> = phases.keys().map(String::as_str).collect();
        assert!(named.iter().all(|k| parts.contains(k) || *k == "data_decode"), "{named:?}");
    }
}
