//! `berth-monitor`: the per-container monitor process (see the library's docs for its command
//! line and files).

fn main() {
    std::process::exit(berth_monitor::daemon::main());
}
