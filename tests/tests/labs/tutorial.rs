//! The book's tutorial, run as written: its commands, taken from the
//! book's `sh` blocks, run in a lab of this test's own (its name
//! substituted for "lab"), and what they print is compared with the
//! book's `text` blocks, numbers masked and `…` lines standing for any
//! lines. A change that makes the tutorial stale fails here.

use std::{
    io::{Read as _, Write as _},
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use rocev2_tests::{
    book::{self, assert_shows, mask},
    require_root, rocev2_bin, LabGuard,
};

/// The book's first tutorial, whole.
fn tutorial() -> String {
    book::chapter("tutorial-entropy.md")
}

#[derive(Debug)]
enum Block {
    /// One command per entry, `\` continuations joined.
    Sh(Vec<String>),
    Text(Vec<String>),
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let kind = line.trim();
        if kind != "```sh" && kind != "```text" {
            continue;
        }
        let body: Vec<String> = lines.by_ref().take_while(|l| l.trim() != "```").map(str::to_string).collect();
        if kind == "```text" {
            out.push(Block::Text(body));
            continue;
        }
        let mut commands = Vec::new();
        let mut current = String::new();
        for l in body {
            if let Some(part) = l.strip_suffix('\\') {
                current.push_str(part);
                continue;
            }
            current.push_str(&l);
            if !current.trim().is_empty() {
                commands.push(std::mem::take(&mut current));
            }
            current.clear();
        }
        out.push(Block::Sh(commands));
    }
    out
}

/// Walks the tutorial's blocks in order, so each command and each expected
/// output is the next one the book has.
struct Chapter {
    blocks: Vec<Block>,
    cursor: usize,
    name: String,
}

impl Chapter {
    /// Replaces the book's lab name with ours.
    fn ours(&self, text: &str) -> String {
        let n = &self.name;
        let mut text = text
            .replace("lab-lab", &format!("lab-{n}"))
            .replace("rocev2-lab", &format!("rocev2-{n}"))
            .replace("Lab \"lab\"", &format!("Lab \"{n}\""))
            .replace("--name lab", &format!("--name {n}"));
        for node in ["rtsw", "h1", "h2", "s1", "s2", "dst"] {
            text = text.replace(&format!("lab-{node}"), &format!("{n}-{node}"));
        }
        text
    }

    /// The next command that contains `needle`.
    fn command(&mut self, needle: &str) -> String {
        for i in self.cursor..self.blocks.len() {
            if let Block::Sh(commands) = &self.blocks[i] {
                if let Some(c) = commands.iter().find(|c| c.contains(needle)) {
                    self.cursor = i;
                    let mut c = self.ours(c);
                    // `lab up`/`lab down` use the default name; ours is given.
                    if c.starts_with("rocev2 lab ") {
                        let command = c.split('#').next().unwrap_or_default().trim_end();
                        c = format!("{command} --name {}", self.name);
                    }
                    return c;
                }
            }
        }
        panic!("no command with {needle:?} in the book's tutorial after block {}", self.cursor);
    }

    /// The next output block that contains `needle`.
    fn output(&mut self, needle: &str) -> Vec<String> {
        for i in self.cursor..self.blocks.len() {
            if let Block::Text(lines) = &self.blocks[i] {
                if lines.iter().any(|l| l.contains(needle)) {
                    self.cursor = i + 1;
                    return lines.iter().map(|l| self.ours(l)).collect();
                }
            }
        }
        panic!("no output block with {needle:?} in the book's tutorial after block {}", self.cursor);
    }
}

fn path_with_rocev2() -> String {
    let dir: PathBuf = rocev2_bin().parent().unwrap().to_path_buf();
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default())
}

fn sh(command: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!("exec {command}")).env("PATH", path_with_rocev2());
    cmd
}

/// Runs a foreground command of the tutorial; it must succeed.
fn run(command: &str) -> String {
    let out: Output = sh(command).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "`{command}` failed ({}):\n{stdout}{stderr}", out.status);
    stdout
}

/// A command running in another terminal: output collected as it comes.
struct Background {
    child: Child,
    output: Arc<Mutex<String>>,
    readers: Vec<thread::JoinHandle<()>>,
}

impl Background {
    fn start(command: &str) -> Self {
        // Both streams into one pipe, as a terminal shows them: `run`'s log
        // lines (stderr) and its `ready` line (stdout) keep their order.
        let mut child = sh(&format!("{command} 2>&1")).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let output = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let stdout: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let stderr: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for mut stream in [stdout, stderr] {
            let output = output.clone();
            readers.push(thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    output.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }));
        }
        Self { child, output, readers }
    }

    fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    fn wait_for(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.output().contains(needle) {
            let exited = self.child.try_wait().unwrap();
            assert!(exited.is_none() && Instant::now() < deadline, "no {needle:?} ({exited:?}):\n{}", self.output());
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` (SIGINT is Ctrl-C) and returns everything printed.
    fn stop(mut self, signal: i32) -> String {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
            }
            thread::sleep(Duration::from_millis(50));
        }
        for r in self.readers.drain(..) {
            r.join().unwrap();
        }
        self.output()
    }

    fn wait(mut self) -> String {
        let status = self.child.wait().unwrap();
        for r in self.readers.drain(..) {
            r.join().unwrap();
        }
        assert!(status.success(), "exited with {status}:\n{}", self.output());
        self.output()
    }
}

impl Drop for Background {
    /// After a failed assertion: Ctrl-C first, so a `run` removes its pins
    /// and state; killed if it does not exit.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The last screen `stats --watch` drew.
fn last_frame(watch: &str) -> String {
    watch.rsplit("\x1b[2J\x1b[H").find(|f| !f.trim().is_empty()).unwrap_or_default().to_string()
}

/// Per-member pps of group `spines` in a `stats --watch` frame.
fn spines_rates(frame: &str) -> Vec<u64> {
    let after = frame.split("GROUP spines").nth(1).expect("group spines in the frame");
    after
        .lines()
        .skip(2)
        .take_while(|l| l.trim_start().starts_with('s'))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse().unwrap())
        .collect()
}

/// Sends `gen` (another terminal) and watches the uplinks while it runs.
fn gen_and_watch(gen: &str, watch: &str) -> (String, String) {
    let traffic = Background::start(gen);
    thread::sleep(Duration::from_secs(4));
    let watching = Background::start(watch);
    thread::sleep(Duration::from_millis(3500));
    let frame = last_frame(&watching.stop(libc::SIGINT));
    (traffic.wait(), frame)
}

/// The equivalent of the book's `curl -s 127.0.0.1:9464/metrics`, so the
/// test needs no curl: one HTTP GET inside namespace `netns`.
fn scrape(netns: &str) -> String {
    rocev2_user::sys::netns::in_netns(netns, || {
        let mut stream = std::net::TcpStream::connect("127.0.0.1:9464")?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text)
    })
    .unwrap()
}

#[test]
fn the_book_tutorial_prints_what_the_book_shows() {
    require_root();
    let name = format!("t{}", std::process::id() % 10_000_000);
    let _lab = LabGuard(name.clone());
    let mut chapter = Chapter { blocks: blocks(&tutorial()), cursor: 0, name: name.clone() };

    // 1. The lab.
    let up = run(&chapter.command("rocev2 lab up"));
    assert_shows("lab up", &chapter.output("is up"), &up, mask);

    // 2. The dataplane (terminal 1).
    let mut dataplane = Background::start(&chapter.command(" run --config"));
    dataplane.wait_for("rocev2: ready", Duration::from_secs(60));
    assert_shows("run", &chapter.output("rocev2: ready"), &dataplane.output(), mask);

    // 3./4. Watch while `gen` sends: one uplink carries everything.
    let watch = chapter.command("stats --watch");
    let gen = chapter.command(" gen ");
    let (sent, frame) = gen_and_watch(&gen, &watch);
    assert_shows("gen", &chapter.output("rocev2 gen:"), &sent, mask);
    assert_shows("stats --watch, five-tuple", &chapter.output("GROUP spines"), &frame, mask);
    let rates = spines_rates(&frame);
    assert_eq!(rates.iter().filter(|&&r| r > 0).count(), 1, "five-tuple: one uplink carries everything: {rates:?}");

    // 5. qp hashing, live.
    run(&chapter.command("sed -i"));
    let check = chapter.command(" check ");
    let reload = chapter.command("rocev2 reload");
    let said = run(&check) + &run(&reload);
    assert_shows("check and reload", &chapter.output(": OK ("), &said, mask);
    let (_, frame) = gen_and_watch(&gen, &watch);
    assert_shows("stats --watch, qp", &chapter.output("GROUP spines"), &frame, mask);
    let rates = spines_rates(&frame);
    assert_eq!(rates.iter().filter(|&&r| r > 0).count(), 4, "qp: all four uplinks: {rates:?}");

    let curl = chapter.command("curl");
    let filter = curl.split("grep ").nth(1).expect("the book greps the metrics").trim_matches('\'');
    let netns = format!("{name}-rtsw");
    let metrics: String = scrape(&netns).lines().filter(|l| l.contains(filter)).map(|l| format!("{l}\n")).collect();
    assert_shows("metrics", &chapter.output("rocev2_member_packets_total"), &metrics, mask);

    let explain = run(&chapter.command("rocev2 explain"));
    assert_shows("explain", &chapter.output("packet: udp"), &explain, mask);

    // 5b. Flowlets: stop `run`, edit, start it again, one QP.
    dataplane.stop(libc::SIGINT);
    run(&chapter.command("flowlet_gap_us = 500"));
    let mut dataplane = Background::start(&chapter.command(" run --config"));
    dataplane.wait_for("rocev2: ready", Duration::from_secs(60));
    run(&chapter.command("--qps 1"));
    let stats = run(&chapter.command("rocev2 stats --config"));
    assert_shows("stats after flowlets", &chapter.output("flowlet gap"), &stats, mask);
    dataplane.stop(libc::SIGINT);

    // 6. Offline.
    // The simulation is deterministic: its numbers must match too.
    let entropy = run(&chapter.command("rocev2 entropy"));
    let expected = chapter.output("16 hosts");
    assert_eq!(entropy.trim_end().lines().collect::<Vec<_>>(), expected, "entropy: the book shows other numbers");

    // 7. Clean up.
    let down = run(&chapter.command("rocev2 lab down"));
    assert_shows("lab down", &chapter.output("is down"), &down, mask);
    rocev2_tests::assert_lab_namespaces_gone(&name);

    // 8. Routes from BGP: FRR on every switch, rocev2 follows the kernel.
    let up = run(&chapter.command("--routing bgp"));
    assert_shows("lab up --routing bgp", &chapter.output("BGP converged"), &up, mask);
    let route = run(&chapter.command("route show 10.1.0.0/16"));
    assert_shows("ip route", &chapter.output("nhid"), &route, mask);
    let (run_cmd, gen, stats_cmd) =
        (chapter.command(" run --config"), chapter.command(" gen "), chapter.command("--group s2l1+s2l2"));
    let mut dataplane = Background::start(&run_cmd);
    dataplane.wait_for("rocev2: ready", Duration::from_secs(60));
    assert_shows("run with kernel routes", &chapter.output("following kernel table"), &dataplane.output(), mask);
    run(&gen);
    assert_shows("stats, BGP", &chapter.output("GROUP nh:s1l1+s1l2+s2l1+s2l2"), &run(&stats_cmd), mask);
    run(&chapter.command("no network 10.1.0.0/16"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while run(&format!("ip -n {name}-rtsw route show 10.1.0.0/16")).matches(" via ").count() != 2 {
        assert!(Instant::now() < deadline, "spine 1's withdrawal did not reach the RTSW");
        thread::sleep(Duration::from_millis(100));
    }
    run(&gen);
    assert_shows("stats after the withdrawal", &chapter.output("GROUP nh:s2l1+s2l2"), &run(&stats_cmd), mask);
    dataplane.stop(libc::SIGINT);
    let down = run(&chapter.command("rocev2 lab down"));
    assert_shows("lab down, BGP", &chapter.output("FRR state director"), &down, mask);
    rocev2_tests::assert_lab_namespaces_gone(&name);
}
