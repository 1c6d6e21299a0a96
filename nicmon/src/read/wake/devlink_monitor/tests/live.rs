//! The kernel's own notifications, from a netdevsim device (a simulated one: nothing the host
//! takes for a fault): registered, its `dummy` health reporter broken through debugfs, then
//! deleted. Needs root and netdevsim (`/sys/bus/netdevsim`); otherwise says so and skips.
use super::*;
use std::path::Path;

const BUS: &str = "/sys/bus/netdevsim";
const DEADLINE: Duration = Duration::from_secs(10);

/// A netdevsim device, deleted when dropped.
struct Netdevsim {
    id: u32,
}

impl Netdevsim {
    fn create(id: u32) -> io::Result<Netdevsim> {
        std::fs::write(Path::new(BUS).join("new_device"), format!("{id} 1"))?;
        Ok(Netdevsim { id })
    }

    fn dev_name(&self) -> String {
        format!("netdevsim{}", self.id)
    }
}

impl Drop for Netdevsim {
    fn drop(&mut self) {
        let _ = std::fs::write(Path::new(BUS).join("del_device"), self.id.to_string());
    }
}

/// The next notice `pred` accepts, waiting on the socket (poll(2)) at most until `deadline`.
fn next(sock: &MonitorSocket, deadline: Instant, pred: impl Fn(&Notice) -> bool) -> Option<Notice> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if rc < 0 {
            return None;
        }
        loop {
            match sock.recv(&mut buf) {
                Ok(notices) => {
                    if let Some(n) = notices.into_iter().find(|n| pred(n)) {
                        return Some(n);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) => panic!("devlink socket: {e}"),
            }
        }
    }
}

fn skip(why: &str) {
    println!("devlink_monitor live test skipped: {why}");
}

#[test]
fn a_netdevsim_device_registers_breaks_and_goes() {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return skip("needs root (netdevsim)");
    }
    if !Path::new(BUS).exists() {
        let _ = std::process::Command::new("modprobe").arg("netdevsim").status();
    }
    if !Path::new(BUS).exists() {
        return skip("no netdevsim on this kernel (/sys/bus/netdevsim absent, modprobe netdevsim failed)");
    }
    let sock = match MonitorSocket::open() {
        Ok(s) => s,
        Err(e) => return skip(&format!("devlink netlink monitor refused: {e}")),
    };
    // An id of this process's own, so that parallel runs do not meet.
    let dev = match Netdevsim::create(4700 + std::process::id() % 1000) {
        Ok(d) => d,
        Err(e) => return skip(&format!("cannot create a netdevsim device: {e}")),
    };
    let name = dev.dev_name();
    let ours = |n: &Notice| n.bus == "netdevsim" && n.dev == name;
    let new = next(&sock, Instant::now() + DEADLINE, |n| ours(n) && n.event == Event::New);
    assert!(new.is_some(), "no DEVLINK_CMD_NEW for {name}");

    let debugfs = Path::new("/sys/kernel/debug/netdevsim").join(&name).join("health/break_health");
    if debugfs.exists() {
        // The write's result is the recovery's: the notification is what is tested.
        let _ = std::fs::write(&debugfs, "nicmon wake-up test");
        let health = next(&sock, Instant::now() + DEADLINE, |n| ours(n) && n.event == Event::Health)
            .expect("no DEVLINK_CMD_HEALTH_REPORTER_RECOVER after break_health");
        assert_eq!(health.reporter.as_ref().map(|r| r.0.as_str()), Some("dummy"));
        let wake = health.into_wake(Instant::now(), 1);
        assert_eq!((wake.hook, wake.hint, wake.removed), (Hook::DevlinkMonitor, Hint::Name(name.clone()), false));
    } else {
        skip(&format!("{} absent (debugfs not mounted?): the health part is not tested", debugfs.display()));
    }

    drop(dev);
    let del = next(&sock, Instant::now() + DEADLINE, |n| ours(n) && n.event == Event::Del)
        .expect("no DEVLINK_CMD_DEL after del_device");
    assert!(del.into_wake(Instant::now(), 1).removed);
}
