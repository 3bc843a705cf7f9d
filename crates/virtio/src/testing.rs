//! A host-side virtio driver for tests and fuzz targets: it writes descriptor tables and
//! rings into a `GuestMemoryMmap` the way a guest driver would, drives the virtio-mmio
//! handshake through [`BusDevice`] accesses, and reads back the used ring.
//!
//! The queue helpers take any [`DriverMemory`]: [`guest_memory`]'s, or a VMM's own view of
//! guest RAM (one with a dirty bitmap, say), directly or in an `Arc`.
//!
//! Built only with the `testing` feature.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use branchbox_devices::BusDevice;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap};

use crate::mmio::Interrupt;

/// Descriptor flag: the chain goes on at `next`.
pub const F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer.
pub const F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is an indirect descriptor table.
pub const F_INDIRECT: u16 = 4;

/// Guest memory size of [`guest_memory`].
pub const MEM_SIZE: u64 = 16 << 20;
/// Where [`Buffers`] starts handing out data buffers.
pub const DATA_BASE: u64 = 1 << 20;

/// 16 MiB of guest memory at guest address 0.
pub fn guest_memory() -> Arc<GuestMemoryMmap> {
    Arc::new(
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)])
            .expect("16 MiB of anonymous memory for a test guest"),
    )
}

/// Guest memory a [`DriverQueue`] writes its rings into.
pub trait DriverMemory {
    /// The memory itself.
    type Memory: GuestMemory;
    /// The memory to read and write.
    fn memory(&self) -> &Self::Memory;
}

impl<B: Bitmap + 'static> DriverMemory for GuestMemoryMmap<B> {
    type Memory = Self;
    fn memory(&self) -> &Self {
        self
    }
}

impl<T: DriverMemory> DriverMemory for Arc<T> {
    type Memory = T::Memory;
    fn memory(&self) -> &T::Memory {
        (**self).memory()
    }
}

/// An [`Interrupt`] that counts how often it was raised.
#[derive(Debug, Clone, Default)]
pub struct CountingInterrupt(pub Arc<AtomicU32>);

impl CountingInterrupt {
    /// Interrupts raised so far.
    pub fn count(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

impl Interrupt for CountingInterrupt {
    fn trigger(&self) -> std::io::Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A bump allocator for data buffers in guest memory, from [`DATA_BASE`] on.
#[derive(Debug)]
pub struct Buffers {
    next: u64,
}

impl Default for Buffers {
    fn default() -> Self {
        Buffers { next: DATA_BASE }
    }
}

impl Buffers {
    /// A fresh `len`-byte buffer (16-byte aligned).
    pub fn alloc(&mut self, len: u32) -> GuestAddress {
        let addr = self.next;
        self.next = (self.next + u64::from(len) + 15) & !15;
        assert!(self.next <= MEM_SIZE, "test guest ran out of buffer memory");
        GuestAddress(addr)
    }
}

/// One buffer of a chain to build: `(address, length, device-writable)`.
pub type Buf = (GuestAddress, u32, bool);

/// A split virtqueue as a driver lays it out: descriptor table, available ring, used ring.
#[derive(Debug, Clone)]
pub struct DriverQueue {
    /// Queue size.
    pub size: u16,
    /// Guest address of the descriptor table.
    pub desc: GuestAddress,
    /// Guest address of the available ring.
    pub avail: GuestAddress,
    /// Guest address of the used ring.
    pub used: GuestAddress,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
}

impl DriverQueue {
    /// A queue of `size` entries laid out from `base` (4 KiB aligned) on.
    pub fn new(base: u64, size: u16) -> DriverQueue {
        let desc = base;
        let avail = desc + 16 * u64::from(size);
        let used = (avail + 6 + 2 * u64::from(size) + 3) & !3;
        DriverQueue {
            size,
            desc: GuestAddress(desc),
            avail: GuestAddress(avail),
            used: GuestAddress(used),
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    /// Writes descriptor `index` as given, with no checks: for building malformed chains.
    pub fn write_desc<D: DriverMemory>(
        &self,
        mem: &D,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let mem = mem.memory();
        let at = self.desc.0 + 16 * u64::from(index);
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&raw, GuestAddress(at)).expect("descriptor table inside test memory");
    }

    /// Makes `head` available to the device (no checks: may name any index).
    pub fn push_avail<D: DriverMemory>(&mut self, mem: &D, head: u16) {
        let mem = mem.memory();
        let slot = self.avail.0 + 4 + 2 * u64::from(self.avail_idx % self.size);
        mem.write_obj(head, GuestAddress(slot)).expect("avail ring inside test memory");
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, GuestAddress(self.avail.0 + 2)).expect("avail idx");
    }

    /// Writes `bufs` as one well-formed chain in the next free descriptors and makes it
    /// available; returns its head index.
    pub fn add_chain<D: DriverMemory>(&mut self, mem: &D, bufs: &[Buf]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
            let index = (head + i as u16) % self.size;
            let last = i + 1 == bufs.len();
            let flags = if writable { F_WRITE } else { 0 } | if last { 0 } else { F_NEXT };
            self.write_desc(mem, index, addr.0, len, flags, (index + 1) % self.size);
        }
        self.next_desc = (head + bufs.len() as u16) % self.size;
        self.push_avail(mem, head);
        head
    }

    /// Used-ring entries `(head, len)` added since the last call; then asks (through
    /// `used_event`) to be interrupted for the next one.
    pub fn take_used<D: DriverMemory>(&mut self, mem: &D) -> Vec<(u16, u32)> {
        let mem = mem.memory();
        let idx: u16 = mem.read_obj(GuestAddress(self.used.0 + 2)).expect("used idx");
        let mut out = Vec::new();
        while self.used_seen != idx {
            let at = self.used.0 + 4 + 8 * u64::from(self.used_seen % self.size);
            let id: u32 = mem.read_obj(GuestAddress(at)).expect("used entry");
            let len: u32 = mem.read_obj(GuestAddress(at + 4)).expect("used entry");
            out.push((id as u16, len));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        // Like a driver with VIRTIO_RING_F_EVENT_IDX: ask for an interrupt at the next entry.
        let used_event = GuestAddress(self.avail.0 + 4 + 2 * u64::from(self.size));
        mem.write_obj(self.used_seen, used_event).expect("used_event inside test memory");
        out
    }
}

/// Reads a 32-bit register of a virtio-mmio device.
pub fn read32(dev: &mut dyn BusDevice, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    dev.read(offset, &mut b);
    u32::from_le_bytes(b)
}

/// Writes a 32-bit register of a virtio-mmio device.
pub fn write32(dev: &mut dyn BusDevice, offset: u64, value: u32) {
    dev.write(offset, &value.to_le_bytes());
}

/// Runs the virtio-mmio handshake as Linux does: reset, ACKNOWLEDGE, DRIVER, features
/// (`features`), FEATURES_OK, each queue's size and addresses, ready, DRIVER_OK. Returns the
/// status read back at the end.
pub fn handshake(dev: &mut dyn BusDevice, features: u64, queues: &[DriverQueue]) -> u32 {
    write32(dev, 0x70, 0);
    write32(dev, 0x70, VIRTIO_CONFIG_S_ACKNOWLEDGE);
    write32(dev, 0x70, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER);
    for sel in 0..2u32 {
        write32(dev, 0x24, sel);
        write32(dev, 0x20, (features >> (32 * sel)) as u32);
    }
    let s = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK;
    write32(dev, 0x70, s);
    for (i, q) in queues.iter().enumerate() {
        write32(dev, 0x30, i as u32);
        write32(dev, 0x38, u32::from(q.size));
        for (low, addr) in [(0x80, q.desc), (0x90, q.avail), (0xa0, q.used)] {
            write32(dev, low, addr.0 as u32);
            write32(dev, low + 4, (addr.0 >> 32) as u32);
        }
        write32(dev, 0x44, 1);
    }
    write32(dev, 0x70, s | VIRTIO_CONFIG_S_DRIVER_OK);
    read32(dev, 0x70)
}

/// Notifies queue `index`.
pub fn notify(dev: &mut dyn BusDevice, index: u32) {
    write32(dev, 0x50, index);
}
