//! A loaded program's JIT line table: which source line each byte of its
//! JITed machine code came from, as the kernel keeps it (the line info of
//! the program's BTF, and the JIT address of each line record). The
//! profiler (profile.rs) charges each sample to a line through it.
//!
//! aya 0.14 does not expose these arrays, so they are read with
//! BPF_OBJ_GET_INFO_BY_FD directly (the program's, then its BTF's).

use std::{
    io,
    mem::{size_of, zeroed},
    os::fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

use anyhow::{bail, Context as _, Result};
use aya_obj::generated::{bpf_btf_info, bpf_cmd, bpf_line_info, bpf_prog_info};

/// One line record: the JIT address where its code starts, the first
/// xlated instruction, how many xlated instructions it covers, and where
/// in the source it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JitLine {
    pub addr: u64,
    pub insn: u32,
    pub insns: u32,
    /// Shortened path (`rocev2-ebpf/src/parse.rs`, `core/src/option.rs`).
    pub file: String,
    pub line: u32,
    /// The source line's text as the compiler recorded it, trimmed.
    pub text: String,
}

impl JitLine {
    /// Whether the line is rocev2's own code, not an inlined library
    /// function (core, aya-ebpf) that some rocev2 line called.
    pub fn is_own(&self) -> bool {
        self.file.starts_with("rocev2-")
    }

    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// A program's functions (main program and BPF subprograms) as JIT
/// address ranges, its line records ordered by address, and the return
/// address of each call its machine code makes to a function it knows
/// (a BPF function of its own, or a kernel function by name).
#[derive(Debug, Default)]
pub struct JitLines {
    functions: Vec<std::ops::Range<u64>>,
    lines: Vec<JitLine>,
    returns: std::collections::BTreeMap<u64, Callee>,
}

/// What a call instruction of the JITed code calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Callee {
    /// A BPF function of the program, by its index in the functions.
    Function(usize),
    /// A kernel function (a helper, a map's lookup), by name.
    Kernel(String),
}

impl JitLines {
    pub fn new(functions: Vec<std::ops::Range<u64>>, mut lines: Vec<JitLine>) -> Self {
        lines.sort_by_key(|l| l.addr);
        Self { functions, lines, returns: Default::default() }
    }

    /// Finds the calls in `code`, the functions' JITed bytes one after
    /// the other (as the kernel hands them out): x86's `call rel32` (E8)
    /// whose target is the start of one of the program's functions or of
    /// a kernel function `kernel_fn` names. A stray E8 byte inside another
    /// instruction would have to point exactly at such a start to count.
    pub fn find_calls(&mut self, code: &[u8], kernel_fn: impl Fn(u64) -> Option<String>) {
        let mut offset = 0usize;
        for f in self.functions.clone() {
            let len = (f.end - f.start) as usize;
            let Some(bytes) = code.get(offset..offset + len) else { break };
            offset += len;
            for p in 0..len.saturating_sub(4) {
                if bytes[p] != 0xE8 {
                    continue;
                }
                let rel = i32::from_le_bytes([bytes[p + 1], bytes[p + 2], bytes[p + 3], bytes[p + 4]]);
                let ret = f.start + p as u64 + 5;
                let target = ret.wrapping_add(rel as i64 as u64);
                let callee = match self.functions.iter().position(|g| g.start == target) {
                    Some(i) => Some(Callee::Function(i)),
                    None => kernel_fn(target).map(Callee::Kernel),
                };
                if let Some(c) = callee {
                    self.returns.insert(ret, c);
                }
            }
        }
    }

    /// What the call whose return address is `ip` called, if `ip` is one.
    pub fn returned_from(&self, ip: u64) -> Option<&Callee> {
        self.returns.get(&ip)
    }

    /// Reads the table of a loaded program.
    pub fn of_program(prog: BorrowedFd<'_>) -> Result<Self> {
        read_program(prog)
    }

    fn function_of(&self, ip: u64) -> Option<&std::ops::Range<u64>> {
        self.functions.iter().find(|f| f.contains(&ip))
    }

    /// Whether `ip` is inside the program's JITed code.
    pub fn contains(&self, ip: u64) -> bool {
        self.function_of(ip).is_some()
    }

    /// The line record whose code holds `ip`.
    pub fn line_at(&self, ip: u64) -> Option<usize> {
        let function = self.function_of(ip)?;
        let i = self.lines.partition_point(|l| l.addr <= ip).checked_sub(1)?;
        function.contains(&self.lines[i].addr).then_some(i)
    }

    /// Whether line record `index` is the first of a BPF function other
    /// than the main program (the kernel lists the main one first): the
    /// JIT's prologue of the function is at its address.
    pub fn is_subprogram_entry(&self, index: usize) -> bool {
        let addr = self.lines[index].addr;
        self.functions.iter().skip(1).any(|f| f.start == addr)
    }

    pub fn line(&self, index: usize) -> &JitLine {
        &self.lines[index]
    }

    /// The rocev2 line a record belongs to: itself, or for inlined library
    /// code the nearest rocev2 line before it in the same function (the
    /// code that called the library function).
    pub fn owner(&self, index: usize) -> usize {
        let Some(function) = self.function_of(self.lines[index].addr) else { return index };
        (0..=index)
            .rev()
            .take_while(|&i| function.contains(&self.lines[i].addr))
            .find(|&i| self.lines[i].is_own())
            .unwrap_or(index)
    }
}

/// `rocev2-ebpf/src/parse.rs` from `/work/x/rocev2-ebpf/src/parse.rs`,
/// `aya-ebpf-0.2.1/src/programs/xdp.rs` from a registry path,
/// `core/src/option.rs` from the toolchain's library.
pub fn short_path(path: &str) -> String {
    match path.rfind("/src/") {
        Some(at) => {
            let crate_dir = path[..at].rsplit('/').next().unwrap_or("");
            format!("{crate_dir}{}", &path[at..])
        }
        None => path.rsplit('/').next().unwrap_or(path).to_owned(),
    }
}

// ------------------------------------------------------------ syscalls

/// The `info` member of `union bpf_attr` for BPF_OBJ_GET_INFO_BY_FD.
#[repr(C)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The `*_GET_FD_BY_ID` member of `union bpf_attr`.
#[repr(C)]
struct FdById {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

fn bpf<T>(cmd: bpf_cmd, attr: &mut T) -> io::Result<i64> {
    // SAFETY: `attr` is the union member `cmd` reads, sized as passed;
    // any buffer it points to is sized by the counts it carries.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd as libc::c_int, attr as *mut T, size_of::<T>()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn info_by_fd<T>(fd: BorrowedFd<'_>, info: &mut T) -> io::Result<()> {
    let mut attr =
        InfoByFd { bpf_fd: fd.as_raw_fd() as u32, info_len: size_of::<T>() as u32, info: info as *mut T as u64 };
    bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
}

fn read_program(prog: BorrowedFd<'_>) -> Result<JitLines> {
    // SAFETY: a plain C struct; all zero asks only for the counts.
    let mut counts: bpf_prog_info = unsafe { zeroed() };
    info_by_fd(prog, &mut counts).context("BPF_OBJ_GET_INFO_BY_FD (program)")?;
    if counts.nr_jited_line_info == 0 || counts.nr_line_info == 0 {
        bail!("the program has no JIT line table (loaded without BTF line info, or the JIT is off)");
    }
    let mut ksyms = vec![0u64; counts.nr_jited_ksyms as usize];
    let mut func_lens = vec![0u32; counts.nr_jited_func_lens as usize];
    // SAFETY: bpf_line_info is plain data.
    let mut line_info: Vec<bpf_line_info> = vec![unsafe { zeroed() }; counts.nr_line_info as usize];
    let mut jited_lines = vec![0u64; counts.nr_jited_line_info as usize];
    let mut code = vec![0u8; counts.jited_prog_len as usize];
    // SAFETY: as above; each array below is sized by the count beside it.
    let mut info: bpf_prog_info = unsafe { zeroed() };
    info.nr_jited_ksyms = ksyms.len() as u32;
    info.jited_ksyms = ksyms.as_mut_ptr() as u64;
    info.nr_jited_func_lens = func_lens.len() as u32;
    info.jited_func_lens = func_lens.as_mut_ptr() as u64;
    info.nr_line_info = line_info.len() as u32;
    info.line_info_rec_size = size_of::<bpf_line_info>() as u32;
    info.line_info = line_info.as_mut_ptr() as u64;
    info.nr_jited_line_info = jited_lines.len() as u32;
    info.jited_line_info_rec_size = size_of::<u64>() as u32;
    info.jited_line_info = jited_lines.as_mut_ptr() as u64;
    info.jited_prog_len = code.len() as u32;
    info.jited_prog_insns = code.as_mut_ptr() as u64;
    info_by_fd(prog, &mut info).context("BPF_OBJ_GET_INFO_BY_FD (program, line tables)")?;
    if ksyms.iter().all(|&a| a == 0) {
        bail!("the kernel hid the JIT addresses (kernel.kptr_restrict or no CAP_SYSLOG)");
    }
    let strings = btf_strings(counts.btf_id)?;
    let xlated_insns = counts.xlated_prog_len / 8;
    let functions = ksyms.iter().zip(&func_lens).map(|(&start, &len)| start..start + u64::from(len)).collect();
    let lines = line_info
        .iter()
        .zip(&jited_lines)
        .enumerate()
        .map(|(i, (rec, &addr))| {
            let next_insn = line_info.get(i + 1).map_or(xlated_insns, |n| n.insn_off);
            JitLine {
                addr,
                insn: rec.insn_off,
                insns: next_insn.saturating_sub(rec.insn_off),
                file: short_path(&string_at(&strings, rec.file_name_off)),
                // The upper 22 bits are the line, the lower 10 the column.
                line: rec.line_col >> 10,
                text: string_at(&strings, rec.line_off).trim().to_owned(),
            }
        })
        .collect();
    let mut table = JitLines::new(functions, lines);
    let kernel = kernel_functions();
    table.find_calls(&code, |addr| kernel.get(&addr).cloned());
    Ok(table)
}

/// The kernel's functions by address, from /proc/kallsyms (empty if the
/// addresses are hidden: no call to the kernel is then recognised).
fn kernel_functions() -> std::collections::HashMap<u64, String> {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (addr, kind, name) = (it.next()?, it.next()?, it.next()?);
            let addr = u64::from_str_radix(addr, 16).ok().filter(|&a| a != 0)?;
            matches!(kind, "t" | "T").then(|| (addr, name.to_owned()))
        })
        .collect()
}

/// A loaded program's xlated instructions (8 bytes each), as
/// `bpftool prog dump xlated` reads them.
pub fn xlated_insns(prog: BorrowedFd<'_>) -> Result<Vec<[u8; 8]>> {
    // SAFETY: a plain C struct; all zero asks only for the counts.
    let mut counts: bpf_prog_info = unsafe { zeroed() };
    info_by_fd(prog, &mut counts).context("BPF_OBJ_GET_INFO_BY_FD (program)")?;
    let mut insns = vec![[0u8; 8]; counts.xlated_prog_len as usize / 8];
    // SAFETY: as above; the buffer holds xlated_prog_len bytes.
    let mut info: bpf_prog_info = unsafe { zeroed() };
    info.xlated_prog_len = (insns.len() * 8) as u32;
    info.xlated_prog_insns = insns.as_mut_ptr() as u64;
    info_by_fd(prog, &mut info).context("BPF_OBJ_GET_INFO_BY_FD (xlated instructions)")?;
    Ok(insns)
}

/// The string section of the BTF object `id` (what line records point into).
fn btf_strings(id: u32) -> Result<Vec<u8>> {
    let mut by_id = FdById { id, next_id: 0, open_flags: 0 };
    let fd = bpf(bpf_cmd::BPF_BTF_GET_FD_BY_ID, &mut by_id).with_context(|| format!("BPF_BTF_GET_FD_BY_ID {id}"))?;
    // SAFETY: the syscall returned a new descriptor that we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: plain C struct.
    let mut info: bpf_btf_info = unsafe { zeroed() };
    info_by_fd(fd.as_fd(), &mut info).context("BPF_OBJ_GET_INFO_BY_FD (BTF size)")?;
    let mut raw = vec![0u8; info.btf_size as usize];
    // SAFETY: plain C struct; the buffer holds btf_size bytes.
    let mut info: bpf_btf_info = unsafe { zeroed() };
    info.btf = raw.as_mut_ptr() as u64;
    info.btf_size = raw.len() as u32;
    info_by_fd(fd.as_fd(), &mut info).context("BPF_OBJ_GET_INFO_BY_FD (BTF)")?;
    btf_string_section(&raw)
}

/// The string section of raw BTF: after the header (`hdr_len`) at
/// `str_off`, `str_len` bytes (struct btf_header).
pub fn btf_string_section(raw: &[u8]) -> Result<Vec<u8>> {
    let word = |at: usize| raw.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    if raw.get(0..2) != Some(&0xEB9Fu16.to_le_bytes()[..]) {
        bail!("not BTF (bad magic)");
    }
    let (Some(hdr_len), Some(str_off), Some(str_len)) = (word(4), word(16), word(20)) else {
        bail!("BTF header cut short");
    };
    let start = hdr_len + str_off;
    raw.get(start..start + str_len).map(<[u8]>::to_vec).context("BTF string section outside the data")
}

fn string_at(strings: &[u8], offset: u32) -> String {
    let tail = strings.get(offset as usize..).unwrap_or_default();
    let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
    String::from_utf8_lossy(&tail[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(addr: u64, file: &str, line: u32) -> JitLine {
        JitLine { addr, insn: 0, insns: 1, file: file.into(), line, text: String::new() }
    }

    #[test]
    fn paths_are_shortened_to_crate_and_file() {
        assert_eq!(short_path("/work/main/rocev2-ebpf/src/parse.rs"), "rocev2-ebpf/src/parse.rs");
        assert_eq!(
            short_path("/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/aya-ebpf-0.2.1/src/programs/xdp.rs"),
            "aya-ebpf-0.2.1/src/programs/xdp.rs"
        );
        assert_eq!(
            short_path("/root/.rustup/toolchains/nightly/lib/rustlib/src/rust/library/core/src/option.rs"),
            "core/src/option.rs"
        );
    }

    #[test]
    fn addresses_map_to_their_line_and_library_lines_to_their_caller() {
        let table = JitLines::new(
            vec![100..200, 300..400],
            vec![
                line(100, "rocev2-ebpf/src/main.rs", 1),
                line(120, "core/src/option.rs", 9),
                line(300, "core/src/option.rs", 9),
                line(310, "rocev2-common/src/hash.rs", 5),
            ],
        );
        assert_eq!(table.line_at(99), None);
        assert_eq!(table.line_at(100), Some(0));
        assert_eq!(table.line_at(150), Some(1));
        assert_eq!(table.line_at(250), None, "between functions");
        assert_eq!(table.line_at(305), Some(2));
        assert_eq!(table.owner(1), 0, "inlined library code belongs to the rocev2 line before it");
        assert_eq!(table.owner(2), 2, "no rocev2 line before it in its own function: itself");
        assert_eq!(table.owner(3), 3);
        assert!(table.is_subprogram_entry(2), "the first record of the second function");
        assert!(!table.is_subprogram_entry(0), "the main program's entry is not a call's");
        assert!(!table.is_subprogram_entry(3));
    }

    #[test]
    fn calls_to_known_functions_are_found_in_the_machine_code() {
        let mut table =
            JitLines::new(vec![0x1000..0x1010, 0x1010..0x1018], vec![line(0x1000, "rocev2-ebpf/src/main.rs", 1)]);
        let mut code = vec![0x90u8; 0x18];
        // 0x1002: call 0x1010 (rel 0x1010 - 0x1007 = 9), the second function.
        code[2..7].copy_from_slice(&[0xE8, 9, 0, 0, 0]);
        // 0x1008: call 0x500 (rel 0x500 - 0x100d), a kernel function.
        code[8] = 0xE8;
        code[9..13].copy_from_slice(&(0x500i32 - 0x100d).to_le_bytes());
        // 0x1011, in the second function: an E8 pointing nowhere known.
        code[0x11] = 0xE8;
        table.find_calls(&code, |a| (a == 0x500).then(|| "bpf_ktime_get_ns".to_owned()));
        assert_eq!(table.returned_from(0x1007), Some(&Callee::Function(1)));
        assert_eq!(table.returned_from(0x100d), Some(&Callee::Kernel("bpf_ktime_get_ns".into())));
        assert_eq!(table.returned_from(0x1016), None);
        assert_eq!(table.returns.len(), 2);
    }

    #[test]
    fn btf_string_section_is_found_after_the_header() {
        let mut raw = vec![0u8; 24];
        raw[0..2].copy_from_slice(&0xEB9Fu16.to_le_bytes());
        raw[4..8].copy_from_slice(&24u32.to_le_bytes()); // hdr_len
        raw[16..20].copy_from_slice(&2u32.to_le_bytes()); // str_off
        raw[20..24].copy_from_slice(&6u32.to_le_bytes()); // str_len
        raw.extend_from_slice(b"TT\0ab\0c\0");
        let strings = btf_string_section(&raw).unwrap();
        assert_eq!(string_at(&strings, 1), "ab");
        assert_eq!(string_at(&strings, 4), "c");
        assert!(btf_string_section(&raw[1..]).is_err());
    }
}
