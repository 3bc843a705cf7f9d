//! The kernel command line: the caller's arguments, checked against the kernel's own limit.
//! (The virtio-mmio devices are described in the DSDT, see [`crate::acpi`], not here.)

use crate::layout::{CMDLINE_ADDR, CMDLINE_MAX};
use crate::{Error, Result};
use linux_loader::cmdline::Cmdline;
use vm_memory::{GuestAddress, GuestMemoryBackend};

/// A command line being put together for one boot.
#[derive(Debug, Clone)]
pub struct KernelCmdline {
    inner: Cmdline,
}

impl KernelCmdline {
    /// Starts from the caller's arguments (for example `console=ttyS0 pci=off`).
    pub fn new(args: &str) -> Result<KernelCmdline> {
        if args.len() >= CMDLINE_MAX {
            return Err(Error::CmdlineTooLong { len: args.len(), max: CMDLINE_MAX - 1 });
        }
        if let Some(bad) = args.bytes().find(|b| !(b' '..=b'~').contains(b)) {
            return Err(Error::Cmdline(format!(
                "invalid kernel command line: byte {bad:#04x} is not printable ASCII"
            )));
        }
        let inner = Cmdline::try_from(args, CMDLINE_MAX).map_err(|e| cmdline_error(args.len(), e))?;
        Ok(KernelCmdline { inner })
    }

    /// Adds one argument (`key=value` or a flag).
    pub fn push(&mut self, arg: &str) -> Result<()> {
        let len = self.len() + 1 + arg.len();
        self.inner.insert_str(arg).map_err(|e| cmdline_error(len, e))
    }

    /// The command line as the kernel will see it, without the NUL.
    pub fn as_string(&self) -> Result<String> {
        let c = self.inner.as_cstring().map_err(|e| cmdline_error(0, e))?;
        c.into_string().map_err(|_| Error::Cmdline("the command line is not UTF-8".into()))
    }

    /// Bytes of the command line without its NUL.
    pub fn len(&self) -> usize {
        self.inner.as_cstring().map(|c| c.as_bytes().len()).unwrap_or(0)
    }

    /// Whether the command line is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes it, NUL-terminated, at [`CMDLINE_ADDR`].
    pub fn write<M: GuestMemoryBackend>(&self, mem: &M) -> Result<()> {
        linux_loader::loader::load_cmdline(mem, GuestAddress(CMDLINE_ADDR), &self.inner)
            .map_err(|e| Error::Cmdline(format!("cannot write the command line into guest memory: {e}")))
    }
}

fn cmdline_error(len: usize, e: linux_loader::cmdline::Error) -> Error {
    match e {
        linux_loader::cmdline::Error::TooLarge => Error::CmdlineTooLong { len, max: CMDLINE_MAX - 1 },
        other => Error::Cmdline(format!("invalid kernel command line: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryMmap};

    #[test]
    fn arguments_are_appended_in_order() {
        let mut c = KernelCmdline::new("console=ttyS0 pci=off").unwrap();
        c.push("quiet").unwrap();
        assert_eq!(c.as_string().unwrap(), "console=ttyS0 pci=off quiet");
    }

    #[test]
    fn the_kernel_limit_is_enforced_with_the_length_named() {
        let long = "x".repeat(CMDLINE_MAX);
        match KernelCmdline::new(&long) {
            Err(Error::CmdlineTooLong { len, max }) => assert_eq!((len, max), (CMDLINE_MAX, CMDLINE_MAX - 1)),
            other => panic!("{other:?}"),
        }
        let mut near = KernelCmdline::new(&"y".repeat(CMDLINE_MAX - 20)).unwrap();
        assert!(matches!(near.push(&"z".repeat(40)), Err(Error::CmdlineTooLong { .. })));
    }

    #[test]
    fn written_nul_terminated_at_its_address() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let c = KernelCmdline::new("console=ttyS0 root=/dev/vda rw").unwrap();
        c.write(&mem).unwrap();
        let mut buf = vec![0u8; c.len() + 1];
        mem.read_slice(&mut buf, GuestAddress(CMDLINE_ADDR)).unwrap();
        assert_eq!(buf, b"console=ttyS0 root=/dev/vda rw\0");
    }

    #[test]
    fn control_characters_are_refused() {
        assert!(matches!(KernelCmdline::new("console=tty\x01S0 quiet"), Err(Error::Cmdline(_))));
    }
}
