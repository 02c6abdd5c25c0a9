//! Minimal OCI bundles for tests that drive runc directly: a static busybox rootfs and a
//! `config.json` running one command in fresh namespaces.

use std::fs;
use std::path::Path;

use serde_json::{Value, json};

/// Applets hard-linked next to `/bin/busybox` in the rootfs.
const APPLETS: &[&str] = &["sh", "echo", "sleep", "head", "tr", "test", "cat"];

/// Writes `<bundle>/rootfs` (Debian's static busybox with a few applets, `/tmp`) and
/// `<bundle>/config.json` running `args` as root with `PATH=/bin`, `/proc` and a `/dev` tmpfs, in
/// new pid/mount/ipc/uts/network namespaces, with `resources` as `linux.resources`.
pub fn write_busybox_bundle(bundle: &Path, args: &[&str], hostname: &str, resources: Value) {
    let bin = bundle.join("rootfs/bin");
    fs::create_dir_all(&bin).expect("create rootfs/bin");
    fs::create_dir_all(bundle.join("rootfs/tmp")).expect("create rootfs/tmp");
    fs::copy("/bin/busybox", bin.join("busybox")).expect("/bin/busybox (Debian busybox-static) is installed");
    for applet in APPLETS {
        fs::hard_link(bin.join("busybox"), bin.join(applet)).expect("hard-link a busybox applet");
    }
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin"],
            "cwd": "/",
        },
        "root": {"path": "rootfs"},
        "hostname": hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}, {"type": "network"}],
            "resources": resources,
        },
    });
    fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&config).expect("json"))
        .expect("write config.json");
}
