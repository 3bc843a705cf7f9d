//! The 8250 UART at COM1 (vm-superio's emulation), whose output goes to a per-sandbox log.
//!
//! A guest can print without end, so the log has a byte cap: past it the device keeps
//! working (the guest never sees an error) but output is dropped, and the log ends with one
//! line saying so. Output is written a line at a time: a boot's console is thousands of
//! bytes, one exit each, and a write call per byte would cost more than the exits.

use crate::{Action, BusDevice};
use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::{Serial as Uart, Trigger};
use vmm_sys_util::eventfd::EventFd;

/// Bytes of guest output buffered before a write even without a newline.
const LINE_MAX: usize = 4096;
/// The receive FIFO's size in vm-superio (a saved state holding more is refused).
const FIFO_MAX: usize = 64;

/// The guest's console output, written to a file up to a cap.
pub struct CappedLog {
    file: Option<File>,
    line: Vec<u8>,
    written: u64,
    cap: u64,
    dropped: u64,
    noted: bool,
}

impl CappedLog {
    /// Creates (truncating) the log at `path`, keeping at most `cap` bytes of guest output.
    pub fn create(path: &Path, cap: u64) -> io::Result<CappedLog> {
        let file = OpenOptions::new().create(true).write(true).truncate(true).open(path)?;
        Ok(CappedLog { file: Some(file), line: Vec::new(), written: 0, cap, dropped: 0, noted: false })
    }

    /// A log that keeps nothing (a device restored without a file yet, or output not wanted).
    pub fn discard() -> CappedLog {
        CappedLog { file: None, line: Vec::new(), written: 0, cap: 0, dropped: 0, noted: false }
    }

    /// Guest bytes written to the file so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Guest bytes dropped because the cap was reached.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Writes out a partial last line (the device flushes only at newlines or when full).
    pub fn flush_line(&mut self) {
        if !self.line.is_empty() {
            self.write_out();
        }
    }

    fn write_out(&mut self) {
        let Some(file) = self.file.as_mut() else {
            self.dropped += self.line.len() as u64;
            self.line.clear();
            return;
        };
        let room = self.cap.saturating_sub(self.written);
        let keep = self.line.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        // A failing log (disk full) must not become a guest-visible error: count it as dropped.
        if keep > 0 && file.write_all(&self.line[..keep]).is_ok() {
            self.written += keep as u64;
        } else {
            self.dropped += keep as u64;
        }
        let over = (self.line.len() - keep) as u64;
        if over > 0 {
            self.dropped += over;
            if !self.noted {
                self.noted = true;
                let _ = writeln!(
                    file,
                    "\n[branchbox: serial log reached its cap of {} bytes; later output dropped]",
                    self.cap
                );
            }
        }
        self.line.clear();
    }
}

impl Write for CappedLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for &b in buf {
            self.line.push(b);
            if b == b'\n' || self.line.len() >= LINE_MAX {
                self.write_out();
            }
        }
        Ok(buf.len())
    }

    /// vm-superio flushes after every byte; lines are written out as they end instead.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for CappedLog {
    fn drop(&mut self) {
        self.flush_line();
    }
}

/// The UART's interrupt line: an eventfd the VMM registers with KVM as an irqfd.
pub struct IrqEvent(pub EventFd);

impl Trigger for IrqEvent {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Saved state of a [`Serial`]: vm-superio's registers and receive FIFO.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SerialDeviceState {
    /// Divisor latch, low and high byte.
    pub baud_divisor: [u8; 2],
    /// Interrupt enable register.
    pub interrupt_enable: u8,
    /// Interrupt identification register.
    pub interrupt_identification: u8,
    /// Line control register.
    pub line_control: u8,
    /// Line status register.
    pub line_status: u8,
    /// Modem control register.
    pub modem_control: u8,
    /// Modem status register.
    pub modem_status: u8,
    /// Scratch register.
    pub scratch: u8,
    /// Bytes received and not yet read by the guest.
    pub in_buffer: Vec<u8>,
}

/// The COM1 device.
pub struct Serial {
    uart: Uart<IrqEvent, NoEvents, CappedLog>,
}

impl Serial {
    /// A UART that raises `irq` and writes the guest's output to `log`.
    pub fn new(irq: EventFd, log: CappedLog) -> Serial {
        Serial { uart: Uart::new(IrqEvent(irq), log) }
    }

    /// The log, for its counters.
    pub fn log(&self) -> &CappedLog {
        self.uart.writer()
    }

    /// Writes out buffered output (a partial last line).
    pub fn flush(&mut self) {
        self.uart.writer_mut().flush_line();
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) -> Action {
        // The UART has byte registers only; wider or out-of-range reads see all ones.
        match (u8::try_from(offset), data) {
            (Ok(off), [byte]) if off < 8 => *byte = self.uart.read(off),
            (_, data) => data.fill(0xff),
        }
        Action::Continue
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Action {
        if let (Ok(off), [value]) = (u8::try_from(offset), data) {
            if off < 8 {
                // The log never fails; an interrupt that cannot be raised is lost, as on a
                // line with nobody listening, and the guest's driver polls on.
                let _ = self.uart.write(off, *value);
            }
        }
        Action::Continue
    }
}

impl Snapshottable for Serial {
    type State = SerialDeviceState;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = RestoreError;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<SerialDeviceState, RestoreError> {
        let s = self.uart.state();
        Ok(SerialDeviceState {
            baud_divisor: [s.baud_divisor_low, s.baud_divisor_high],
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        })
    }

    fn restore(&mut self, state: &SerialDeviceState, _ctx: &NoContext) -> Result<(), RestoreError> {
        if state.in_buffer.len() > FIFO_MAX {
            return Err(RestoreError::new(
                "serial",
                format!("receive FIFO of {} bytes exceeds the UART's {FIFO_MAX}", state.in_buffer.len()),
            ));
        }
        let s = SerialState {
            baud_divisor_low: state.baud_divisor[0],
            baud_divisor_high: state.baud_divisor[1],
            interrupt_enable: state.interrupt_enable,
            interrupt_identification: state.interrupt_identification,
            line_control: state.line_control,
            line_status: state.line_status,
            modem_control: state.modem_control,
            modem_status: state.modem_status,
            scratch: state.scratch,
            in_buffer: state.in_buffer.clone(),
        };
        let irq = |uart: &Uart<IrqEvent, NoEvents, CappedLog>| {
            uart.interrupt_evt()
                .0
                .try_clone()
                .map(IrqEvent)
                .map_err(|e| RestoreError::new("serial", e.to_string()))
        };
        let (placeholder_irq, irq) = (irq(&self.uart)?, irq(&self.uart)?);
        // vm-superio builds a UART from a state only by value: move the log out and back.
        let old = std::mem::replace(&mut self.uart, Uart::new(placeholder_irq, CappedLog::discard()));
        self.uart = Uart::from_state(&s, irq, NoEvents, old.into_writer())
            .map_err(|e| RestoreError::new("serial", format!("{e:?}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serial(cap: u64) -> (Serial, EventFd, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let log = CappedLog::create(&dir.path().join("serial.log"), cap).unwrap();
        (Serial::new(irq.try_clone().unwrap(), log), irq, dir)
    }

    fn print(s: &mut Serial, text: &[u8]) {
        for b in text {
            s.write(0, &[*b]);
        }
    }

    #[test]
    fn guest_output_reaches_the_log_line_by_line() {
        let (mut s, _irq, dir) = serial(1 << 20);
        print(&mut s, b"Linux version 6.12\nCommand line: console=ttyS0\npartial");
        let log = std::fs::read_to_string(dir.path().join("serial.log")).unwrap();
        assert_eq!(log, "Linux version 6.12\nCommand line: console=ttyS0\n");
        s.flush();
        let log = std::fs::read_to_string(dir.path().join("serial.log")).unwrap();
        assert!(log.ends_with("partial"));
    }

    #[test]
    fn output_past_the_cap_is_dropped_and_said_once() {
        let (mut s, _irq, dir) = serial(100);
        for _ in 0..50 {
            print(&mut s, b"0123456789abcdefghij\n");
        }
        s.flush();
        assert_eq!(s.log().written(), 100);
        assert_eq!(s.log().dropped(), 50 * 21 - 100);
        let log = std::fs::read(dir.path().join("serial.log")).unwrap();
        assert!(log.len() < 200, "the file stays near its cap: {} bytes", log.len());
        let text = String::from_utf8_lossy(&log);
        assert_eq!(text.matches("reached its cap of 100 bytes").count(), 1);
    }

    #[test]
    fn odd_accesses_never_panic() {
        let (mut s, _irq, _dir) = serial(1024);
        let mut wide = [0u8; 4];
        s.read(0, &mut wide);
        assert_eq!(wide, [0xff; 4]);
        let mut one = [0u8; 1];
        s.read(u64::MAX, &mut one);
        assert_eq!(one, [0xff]);
        s.write(300, &[1]);
        s.write(0, &[]);
        s.read(5, &mut one);
        assert_ne!(one[0] & 0x20, 0, "line status: transmitter empty");
    }

    #[test]
    fn an_enabled_transmit_interrupt_raises_the_line() {
        let (mut s, irq, _dir) = serial(1024);
        s.write(1, &[0x02]); // IER: transmitter holding register empty
        print(&mut s, b"x");
        assert!(irq.read().unwrap() >= 1);
    }

    #[test]
    fn registers_and_fifo_survive_save_and_restore() {
        let (mut s, _irq, dir) = serial(1024);
        s.write(7, &[0x5a]); // scratch
        s.write(3, &[0x83]); // LCR with DLAB
        s.write(0, &[0x01]); // divisor low: 115200 baud
        s.write(3, &[0x03]);
        let saved = s.save(&mut NoContext).unwrap();
        assert_eq!((saved.scratch, saved.baud_divisor[0], saved.line_control), (0x5a, 1, 3));

        let (mut t, _irq2, _dir2) = serial(1024);
        t.restore(&saved, &NoContext).unwrap();
        let mut b = [0u8];
        t.read(7, &mut b);
        assert_eq!(b[0], 0x5a);
        assert_eq!(t.save(&mut NoContext).unwrap(), saved);
        print(&mut t, b"after restore\n");
        drop(dir);

        let bad = SerialDeviceState { in_buffer: vec![0; 65], ..saved };
        let err = t.restore(&bad, &NoContext).unwrap_err();
        assert!(err.to_string().contains("65 bytes exceeds"), "{err}");
    }
}
