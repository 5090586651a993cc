//! `agentbox-helper`: see the library for the jobs. Prints one report line; the same line goes
//! to the container's termination message, where the operator reads it.
#![forbid(unsafe_code)]

use agentbox_helper::{Error, Job, quota};

/// The kubelet's default `terminationMessagePath`.
const TERMINATION_LOG: &str = "/dev/termination-log";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let job = Job::parse(&args);
    // A job whose output is stdout (an archive) reports on stderr only.
    let stdout_taken = job.as_ref().is_ok_and(Job::writes_stdout);
    let outcome = job.and_then(|job| job.run());
    let (line, code) = match &outcome {
        // A workspace over its limit: a report, and a code the operator tells apart.
        Ok(report) if report.flag("over") == Some(true) => (report.line(), quota::OVER_LIMIT_EXIT),
        Ok(report) => (report.line(), 0),
        Err(e @ Error::Usage(_)) => (format!("agentbox-helper: {e}"), 2),
        Err(e) => (format!("agentbox-helper: {e}"), 1),
    };
    if (code == 0 || code == quota::OVER_LIMIT_EXIT) && !stdout_taken {
        println!("{line}");
    } else {
        eprintln!("{line}");
    }
    // Best effort: outside a pod there is no termination log.
    let _ = std::fs::write(TERMINATION_LOG, format!("{line}\n"));
    std::process::exit(code);
}
