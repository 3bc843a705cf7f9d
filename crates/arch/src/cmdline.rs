//! The kernel command line: the caller's arguments plus one `virtio_mmio.device=` entry per
//! virtio-mmio device, checked against the kernel's own limit.

use crate::layout::{virtio_mmio_slot, CMDLINE_ADDR, CMDLINE_MAX, VIRTIO_MMIO_SIZE};
use crate::{Error, Result};
use linux_loader::cmdline::Cmdline;
use vm_memory::{GuestAddress, GuestMemoryBackend};

/// A command line being put together for one boot.
#[derive(Debug, Clone)]
pub struct KernelCmdline {
    inner: Cmdline,
    devices: u32,
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
        Ok(KernelCmdline { inner, devices: 0 })
    }

    /// Adds the next virtio-mmio device and returns its register window and interrupt line.
    pub fn add_virtio_mmio(&mut self) -> Result<(GuestAddress, u32)> {
        let (addr, irq) = virtio_mmio_slot(self.devices)?;
        let len = self.len();
        self.inner
            .add_virtio_mmio_device(VIRTIO_MMIO_SIZE, addr, irq, None)
            .map_err(|e| cmdline_error(len, e))?;
        self.devices += 1;
        Ok((addr, irq))
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
    fn devices_are_appended_in_slot_order() {
        let mut c = KernelCmdline::new("console=ttyS0 pci=off").unwrap();
        assert_eq!(c.add_virtio_mmio().unwrap(), (GuestAddress(0xd000_0000), 5));
        assert_eq!(c.add_virtio_mmio().unwrap(), (GuestAddress(0xd000_1000), 6));
        assert_eq!(
            c.as_string().unwrap(),
            "console=ttyS0 pci=off virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"
        );
    }

    #[test]
    fn the_kernel_limit_is_enforced_with_the_length_named() {
        let long = "x".repeat(CMDLINE_MAX);
        match KernelCmdline::new(&long) {
            Err(Error::CmdlineTooLong { len, max }) => assert_eq!((len, max), (CMDLINE_MAX, CMDLINE_MAX - 1)),
            other => panic!("{other:?}"),
        }
        let mut near = KernelCmdline::new(&"y".repeat(CMDLINE_MAX - 20)).unwrap();
        assert!(matches!(near.add_virtio_mmio(), Err(Error::CmdlineTooLong { .. })));
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
