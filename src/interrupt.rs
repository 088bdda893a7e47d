//! Stopping cleanly, whatever stops us (docs/DESIGN.md "Atomic results").
//!
//! Every staged run directory is registered here while it exists. SIGINT, SIGTERM and SIGHUP
//! are caught on a thread of their own, which removes every registered staging folder and
//! exits with 128 + the signal's number; a closed stdout ([`broken_pipe`], the SIGPIPE case:
//! SIGPIPE itself stays ignored, so a write fails instead of killing the process) does the
//! same with 141. A process killed outright (SIGKILL, a power cut) cannot clean up: its
//! staging folder carries its pid, and the next run in the same results folder removes it
//! ([`sweep_stale`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set the moment a stop begins: the main thread then never reports the errors that removing
/// its staging folder causes, nor exits with its own code ([`park_if_stopping`]).
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Staging folders of this process that are not yet committed.
static STAGED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Child processes (selftest's runs) that a stop must end too.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The exit code of a process ended by `signal`, as shells report it.
pub const fn exit_code_for(signal: i32) -> u8 {
    128 + signal as u8
}

/// SIGPIPE's number: the exit code of a run whose stdout reader went away is 141.
pub const SIGPIPE: i32 = 13;

/// Starts the signal thread. Call once, first thing in main.
pub fn install() {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
            eprintln!(
                "warning: cannot watch for interrupts; an interrupted run may leave a staging folder"
            );
            return;
        };
        std::thread::spawn(move || {
            if let Some(signal) = signals.forever().next() {
                stop(signal);
            }
        });
    }
}

/// Removes this process's staged run directories and exits as `signal` would have.
pub fn stop(signal: i32) -> ! {
    STOPPING.store(true, Ordering::SeqCst);
    #[cfg(unix)]
    for pid in CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        // SAFETY: sends the signal we got to a child we started and have not yet reaped.
        unsafe { libc::kill(pid as libc::pid_t, signal) };
    }
    let mut staged = STAGED.lock().unwrap_or_else(|e| e.into_inner());
    for dir in staged.drain(..) {
        remove_staging(&dir);
        // stderr may be a closed pipe too: a failed message must not stop the cleanup.
        if !dir.is_file()
            && dir
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(STAGING_PREFIX))
        {
            let _ = writeln!(
                std::io::stderr(),
                "stopped by signal {signal}: removed the unfinished run {}",
                dir.display()
            );
        }
    }
    // The lock is held until the process is gone, so no commit can slip in after the cleanup;
    // `_exit` runs no exit handlers (CUDA's among them) while other threads may be inside them.
    // SAFETY: `_exit` only ends the process.
    unsafe { libc::_exit(exit_code_for(signal) as i32) }
}

/// Called by main before it exits: while a stop is under way, waits for it to end the process
/// (with the signal's code), so that neither the main thread's own code nor an error caused by
/// the removal of its staging folder is reported.
pub fn park_if_stopping() {
    while STOPPING.load(Ordering::SeqCst) {
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
}

/// stdout's reader went away (`| head`): stop as SIGPIPE's default action would, cleaning up.
pub fn broken_pipe() -> ! {
    stop(SIGPIPE)
}

/// Runs `cmd` to completion like `Command::output`, but as a child a stop also ends (a child
/// left running would keep the GPU busy and write into a removed staging folder).
pub(crate) fn output_of_child(
    cmd: &mut std::process::Command,
) -> std::io::Result<std::process::Output> {
    use std::process::Stdio;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
    let out = child.wait_with_output();
    CHILDREN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&p| p != pid);
    out
}

/// A child process a stop must end too (the sanitizer stage's runs).
pub(crate) fn register_child(pid: u32) {
    CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

pub(crate) fn unregister_child(pid: u32) {
    CHILDREN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&p| p != pid);
}

/// Registers a staging folder; it is removed if the process is stopped before [`commit`].
pub(crate) fn register(dir: &Path) {
    STAGED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.to_path_buf());
}

/// Runs `commit` (the rename of `dir` into place) with the registry locked, so that a signal
/// either removes the staging folder first or finds the run committed, never half of each.
pub(crate) fn commit<T>(dir: &Path, commit: impl FnOnce() -> T) -> T {
    let mut staged = STAGED.lock().unwrap_or_else(|e| e.into_inner());
    let out = commit();
    staged.retain(|d| d != dir);
    out
}

/// Forgets `dir` (it was removed by its owner).
pub(crate) fn unregister(dir: &Path) {
    STAGED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|d| d != dir);
}

/// The main thread may still be writing into the folder: retry until it is gone. A
/// registered file (a temporary file of an atomic write) is simply removed.
fn remove_staging(dir: &Path) {
    if dir.is_file() {
        let _ = std::fs::remove_file(dir);
        return;
    }
    for _ in 0..20 {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            _ => return,
        }
    }
}

/// The prefix of a staging folder's name, `.partial-<run>-<host>-<pid>`.
pub(crate) const STAGING_PREFIX: &str = ".partial-";

/// This machine's name as staging folders carry it (`-` and odd characters replaced), so that
/// a sweep never judges another machine's pid (a results folder on a shared file system).
pub fn host_tag() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    let tag: String = host
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if tag.is_empty() { "host".into() } else { tag }
}

/// The staging folder name of run `name` in this process.
pub(crate) fn staging_name(name: &str) -> String {
    format!(
        "{STAGING_PREFIX}{name}-{}-{}",
        host_tag(),
        std::process::id()
    )
}

/// Where a commit moves the folder it replaces, `.partial-<name>-<host>-<pid>.replaced`: the
/// marker after the pid, so that no other target's staging name can read as it.
pub(crate) fn replaced_name(name: &str) -> String {
    format!("{}{REPLACED_SUFFIX}", staging_name(name))
}

const REPLACED_SUFFIX: &str = ".replaced";

/// Removes staging folders under `results_root` left by processes that no longer exist and
/// returns what it removed. Folders of live processes (a concurrent run) are left alone.
pub(crate) fn sweep_stale(results_root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(results_root) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(STAGING_PREFIX) else {
            continue;
        };
        let mut fields = rest.rsplit('-');
        let owner = fields.next().and_then(|p| p.parse::<u32>().ok());
        let host = fields.next();
        let stale = match owner {
            // Another machine's folder: its pid means nothing here; left to that machine.
            Some(_) if host != Some(host_tag().as_str()) => false,
            Some(pid) => !process_alive(pid),
            // Written by a runner before folders carried their pid: stale if over a day old.
            None => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() > 86_400),
        };
        if stale {
            remove_staging(&entry.path());
            removed.push(entry.path());
        }
    }
    removed
}

/// Removes what a dead export to `parent/name` left beside its target, and nothing else: its
/// staging folder `.partial-<name>-<host>-<pid>`, and the old folder it had moved aside,
/// [`replaced_name`], only once the target exists again (else that folder is the only copy of
/// the old export, and is left for the user). Only folders of this
/// machine whose process is gone; anything else of that prefix in a user's folder is theirs.
pub(crate) fn sweep_stale_beside(parent: &Path, name: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let target_exists = parent.join(name).exists();
    let host = host_tag();
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        let Some(rest) = file_name
            .strip_prefix(STAGING_PREFIX)
            .and_then(|r| r.strip_prefix(name))
            .and_then(|r| r.strip_prefix('-'))
        else {
            continue;
        };
        let (replaced, rest) = match rest.strip_suffix(REPLACED_SUFFIX) {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let Some(pid) = rest
            .strip_prefix(host.as_str())
            .and_then(|r| r.strip_prefix('-'))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && !process_alive(pid) && (!replaced || target_exists) {
            remove_staging(&entry.path());
            removed.push(entry.path());
        }
    }
    removed
}

fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    #[cfg(unix)]
    {
        // SAFETY: signal 0 only checks that the process exists; nothing is sent.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beside_an_export_only_its_own_dead_staging_is_swept_and_an_only_old_copy_is_kept() {
        let root = tempfile::tempdir().unwrap();
        let host = host_tag();
        let dead = 2_147_483_632u32;
        let p = |n: &str| root.path().join(n);
        let staging = p(&format!("{STAGING_PREFIX}out-{host}-{dead}"));
        let replaced = p(&format!(
            "{STAGING_PREFIX}out-{host}-{dead}{REPLACED_SUFFIX}"
        ));
        // What another target, `out-2`, left: not ours, whatever its name looks like.
        let out_2 = p(&format!("{STAGING_PREFIX}out-2-{host}-{dead}"));
        let out_2_replaced = p(&format!(
            "{STAGING_PREFIX}out-2-{host}-{dead}{REPLACED_SUFFIX}"
        ));
        let live = p(&staging_name("out"));
        let other_target = p(&format!("{STAGING_PREFIX}other-{host}-{dead}"));
        let users = p(&format!("{STAGING_PREFIX}thesis-drafts"));
        let users_file = p(&format!("{STAGING_PREFIX}out-{host}-{}", dead + 1));
        for d in [
            &staging,
            &replaced,
            &live,
            &other_target,
            &users,
            &out_2,
            &out_2_replaced,
        ] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(&users_file, "a file, not a staging folder").unwrap();
        // The target is missing: the moved-aside folder is the only copy of the old export.
        assert_eq!(sweep_stale_beside(root.path(), "out"), [staging]);
        for kept in [
            &replaced,
            &live,
            &other_target,
            &users,
            &users_file,
            &out_2,
            &out_2_replaced,
        ] {
            assert!(kept.exists(), "{}", kept.display());
        }
        // Once the target exists again, the old copy goes too.
        std::fs::create_dir(p("out")).unwrap();
        assert_eq!(sweep_stale_beside(root.path(), "out"), [replaced]);
        assert!(live.exists() && users.exists() && other_target.exists());
        // And the other target's own sweep takes only its own.
        assert_eq!(sweep_stale_beside(root.path(), "out-2"), [out_2]);
        assert!(out_2_replaced.exists());
    }

    #[test]
    fn staging_folders_of_dead_processes_are_swept_and_live_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        // pid 0x7FFF_FFF0 does not exist on any system we run on.
        let host = host_tag();
        let dead = root.path().join(format!(
            "{STAGING_PREFIX}20260101T000000Z-abc-{host}-2147483632"
        ));
        let live = root.path().join(staging_name("20260101T000000Z-def"));
        // The same dead pid on another machine sharing the folder: not ours to judge.
        let elsewhere = root.path().join(format!(
            "{STAGING_PREFIX}20260101T000000Z-ghi-{host}x-2147483632"
        ));
        let run = root.path().join("20260101T000000Z-123456");
        for d in [&dead, &live, &elsewhere, &run] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(dead.join("correctness.json"), "{").unwrap();
        assert_eq!(sweep_stale(root.path()), vec![dead.clone()]);
        assert!(!dead.exists() && live.exists() && elsewhere.exists() && run.exists());
    }

    #[test]
    fn the_exit_code_of_a_signal_is_128_plus_its_number() {
        assert_eq!(exit_code_for(2), 130);
        assert_eq!(exit_code_for(SIGPIPE), 141);
    }
}
