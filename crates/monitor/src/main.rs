//! `berth-monitor`: the per-container monitor process (see the library's docs for its command
//! line and files).

fn main() {
    // `pause` turns the binary into a pod's infra process (see `berth_monitor::pause`).
    if std::env::args_os().nth(1).is_some_and(|a| a == "pause") {
        let args: Vec<String> = std::env::args_os().skip(2).map(|a| a.to_string_lossy().into_owned()).collect();
        std::process::exit(berth_monitor::pause::main(&args));
    }
    std::process::exit(berth_monitor::daemon::main());
}
