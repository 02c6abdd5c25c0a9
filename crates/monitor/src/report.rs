//! The one message a monitor sends its launcher over the sync pipe (its stdout until then): one
//! JSON line saying whether the container was created.

use serde::{Deserialize, Serialize};

/// The outcome of a monitor's setup, as its launcher receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Report {
    /// The create command succeeded; the monitor now watches the container.
    Created { monitor_pid: i32, container_pid: i32 },
    /// The create command failed; the monitor has exited.
    CreateFailed { exit_code: Option<i32>, stderr: String },
    /// The monitor could not get as far as a container; it has exited.
    Failed { message: String },
}

impl Report {
    /// The report as one line of JSON.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("a report serializes");
        line.push('\n');
        line
    }

    /// The last report line in `output`, if there is one.
    pub fn from_output(output: &str) -> Option<Report> {
        output.lines().rev().find_map(|line| serde_json::from_str(line).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_survives_the_round_trip_through_its_line() {
        for report in [
            Report::Created { monitor_pid: 10, container_pid: 11 },
            Report::CreateFailed { exit_code: Some(1), stderr: "no \"config.json\"\n".into() },
            Report::Failed { message: "opening log file".into() },
        ] {
            let line = report.to_line();
            assert_eq!(line.matches('\n').count(), 1, "{line}");
            assert_eq!(Report::from_output(&format!("noise\n{line}")), Some(report));
        }
    }
}
