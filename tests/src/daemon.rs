//! A `nicmon` process started by a test: killed when dropped (a failing test leaves no
//! daemon behind), its stderr collected when the command pipes it.
use std::process::{Child, Command, ExitStatus};
use std::thread::JoinHandle;

pub struct Daemon {
    child: Child,
    log: Option<JoinHandle<String>>,
}

impl Daemon {
    /// Spawn `cmd`; when it pipes stderr, a thread collects it for [`Daemon::stop`].
    pub fn spawn(cmd: &mut Command) -> Daemon {
        let mut child = cmd.spawn().expect("spawn nicmon");
        let log = child.stderr.take().map(|mut err| {
            std::thread::spawn(move || {
                let mut log = String::new();
                let _ = std::io::Read::read_to_string(&mut err, &mut log);
                log
            })
        });
        Daemon { child, log }
    }

    /// The exit status if the process has ended (`None` while it runs).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL and wait: no cycle finished, nothing flushed or saved.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait (the daemon finishes its cycle, flushes and saves): the exit status
    /// and the collected stderr (empty unless piped).
    pub fn stop(mut self) -> (ExitStatus, String) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let status = self.child.wait().expect("wait for nicmon");
        let log = self.log.take().map(|r| r.join().unwrap_or_default()).unwrap_or_default();
        (status, log)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
