//! Where rocev2 keeps things on the system: one place for every path.

use std::path::PathBuf;

/// State files of running instances and labs (tmpfs: gone at reboot, as
/// the dataplanes they describe are).
pub const RUN_DIR: &str = "/run/rocev2";

/// Where the BPF filesystem is mounted, and pin directories live.
pub const BPFFS: &str = "/sys/fs/bpf";

/// What the file name of an XDP link pin in a pin directory starts with
/// (`link-eth1`): the pin that keeps a port's program attached.
pub const LINK_PIN_PREFIX: &str = "link-";

/// The config file the commands read without `--config`.
pub const DEFAULT_CONFIG: &str = "/etc/rocev2/rocev2.toml";

/// The default pin directory (`[dataplane] pin_dir`).
pub const DEFAULT_PIN_DIR: &str = rocev2_common::maps::PIN_DIR;

/// The pin directory of an instance named `name` (a lab's switch, a test's
/// dataplane): `/sys/fs/bpf/rocev2-NAME`.
pub fn pin_dir_named(name: &str) -> PathBuf {
    PathBuf::from(format!("{BPFFS}/rocev2-{name}"))
}
