//! What the kernel's verifier said when it refused a program, in one line.
//!
//! aya's load error carries the whole verifier log (hundreds of lines for
//! the forwarding program). A user needs the reason, which is the log's
//! last statement, and, for a permission error, which capability is
//! missing; the full log goes to the debug log (`--log-level debug`).

use aya::programs::ProgramError;

/// Loads program `name` with `load`, turning a refusal into a one-line error.
pub fn load(name: &str, load: impl FnOnce() -> Result<(), ProgramError>) -> anyhow::Result<()> {
    load().map_err(|e| rejected(name, e))
}

/// The error for a program the kernel refused to load.
pub fn rejected(name: &str, error: ProgramError) -> anyhow::Error {
    let ProgramError::LoadError { io_error, verifier_log } = error else {
        return anyhow::Error::new(error).context(format!("the kernel rejected program {name}"));
    };
    let log = verifier_log.to_string();
    tracing::debug!(program = name, "verifier output for {name}:\n{log}");
    let reason = reason(&log).map(|r| format!(": the verifier says \"{r}\"")).unwrap_or_default();
    let permission = matches!(io_error.raw_os_error(), Some(libc::EACCES | libc::EPERM));
    let hint = if permission && !crate::sys::privileges::has_perfmon() {
        "; this process lacks CAP_PERFMON, which the verifier needs to accept the programs' pointer handling: run as root or grant cap_bpf,cap_net_admin,cap_perfmon"
    } else {
        ""
    };
    anyhow::anyhow!(
        "the kernel rejected program {name} ({io_error}){reason}{hint} (the whole verifier output: --log-level debug)"
    )
}

/// The verifier's last statement: the last line that is not a statistic
/// (`processed N insns ...`, `verification time`, `stack depth`).
fn reason(log: &str) -> Option<&str> {
    log.lines().map(str::trim).rev().find(|line| {
        !line.is_empty()
            && !line.starts_with("processed ")
            && !line.starts_with("verification time")
            && !line.starts_with("stack depth")
            && !line.starts_with("mark_precise")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_last_statement_not_a_statistic() {
        let log = "0: (bf) r6 = r1\n...\n57: (0f) r1 += r2\nR1 pointer arithmetic with it prohibited for !root\nprocessed 58 insns (limit 1000000) max_states_per_insn 0\n";
        assert_eq!(reason(log), Some("R1 pointer arithmetic with it prohibited for !root"));
        assert_eq!(reason("\n\n"), None);
    }
}
