//! Loading an uncompressed x86_64 kernel (`vmlinux`, ELF) into guest memory.

use crate::layout::HIMEM_START;
use crate::{Error, Result};
use linux_loader::loader::elf::Elf;
use linux_loader::loader::KernelLoader;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use vm_memory::{GuestAddress, GuestMemoryBackend};

/// Largest kernel file accepted; a debug-info vmlinux is ~500 MiB, a small guest's ~20 MiB.
pub const MAX_KERNEL_FILE: u64 = 1 << 30;
/// `e_machine` of x86_64 ELF files.
const EM_X86_64: u16 = 62;

/// Where the kernel went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadedKernel {
    /// The 64-bit entry point (`startup_64`), a guest-physical address.
    pub entry: GuestAddress,
    /// One past the last byte the kernel's segments occupy.
    pub end: u64,
}

/// Loads the ELF kernel at `path` at the physical addresses it was linked for.
pub fn load_vmlinux<M: GuestMemoryBackend>(mem: &M, path: &Path) -> Result<LoadedKernel> {
    let open_err = |error| Error::KernelOpen { path: path.to_path_buf(), error };
    let mut file = File::open(path).map_err(open_err)?;
    let size = file.metadata().map_err(open_err)?.len();
    if size > MAX_KERNEL_FILE {
        return Err(Error::KernelFormat {
            path: path.to_path_buf(),
            detail: format!("{size} bytes, more than the {MAX_KERNEL_FILE} a kernel may have"),
        });
    }
    let mut ident = [0u8; 20];
    file.read_exact(&mut ident).map_err(|_| Error::KernelFormat {
        path: path.to_path_buf(),
        detail: format!("{size} bytes, too short for an ELF header"),
    })?;
    check_ident(&ident).map_err(|detail| Error::KernelFormat { path: path.to_path_buf(), detail })?;
    let loaded = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START))).map_err(|e| {
        Error::KernelFormat {
            path: path.to_path_buf(),
            detail: format!("cannot load it into guest memory: {e}"),
        }
    })?;
    Ok(LoadedKernel { entry: loaded.kernel_load, end: loaded.kernel_end })
}

/// Checks the ELF identification and machine, saying what the file is when it is not an
/// x86_64 ELF (a compressed bzImage is the usual mistake).
fn check_ident(ident: &[u8; 20]) -> std::result::Result<(), String> {
    if &ident[..4] != b"\x7fELF" {
        if ident[..].windows(4).any(|w| w == b"HdrS") || ident.starts_with(b"MZ") {
            return Err("not an ELF file; it looks like a compressed bzImage: pass the vmlinux the kernel \
                        build left next to it"
                .into());
        }
        return Err("not an ELF file (no \\x7fELF magic): pass an uncompressed vmlinux".into());
    }
    if ident[4] != 2 {
        return Err("a 32-bit ELF file: pass an x86_64 vmlinux".into());
    }
    let machine = u16::from_le_bytes([ident[18], ident[19]]);
    if machine != EM_X86_64 {
        return Err(format!("an ELF file for machine {machine}, not x86_64 ({EM_X86_64})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vm_memory::GuestMemoryMmap;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap()
    }

    /// A minimal x86_64 ELF executable: one PT_LOAD segment of `code` at `paddr`.
    fn tiny_elf(paddr: u64, code: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 64 + 56];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2; // 64-bit
        f[5] = 1; // little-endian
        f[6] = 1; // version
        f[16..18].copy_from_slice(&2u16.to_le_bytes()); // executable
        f[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        f[20..24].copy_from_slice(&1u32.to_le_bytes());
        f[24..32].copy_from_slice(&paddr.to_le_bytes()); // entry
        f[32..40].copy_from_slice(&64u64.to_le_bytes()); // program headers
        f[52..54].copy_from_slice(&64u16.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&1u16.to_le_bytes());
        let ph = 64;
        f[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        f[ph + 8..ph + 16].copy_from_slice(&120u64.to_le_bytes()); // file offset
        f[ph + 16..ph + 24].copy_from_slice(&paddr.to_le_bytes());
        f[ph + 24..ph + 32].copy_from_slice(&paddr.to_le_bytes());
        f[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
        f[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64).to_le_bytes());
        f.extend_from_slice(code);
        f
    }

    fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn loads_segments_at_their_physical_address() {
        let m = mem();
        let f = file_with(&tiny_elf(0x100_0000, &[0xf4, 0x90, 0x90]));
        let k = load_vmlinux(&m, f.path()).unwrap();
        assert_eq!(k.entry, GuestAddress(0x100_0000));
        let mut code = [0u8; 3];
        vm_memory::Bytes::read_slice(&m, &mut code, GuestAddress(0x100_0000)).unwrap();
        assert_eq!(code, [0xf4, 0x90, 0x90]);
    }

    #[test]
    fn a_kernel_past_ram_is_refused() {
        let f = file_with(&tiny_elf(0x1000_0000, &[0xf4]));
        let err = load_vmlinux(&mem(), f.path()).unwrap_err();
        assert!(matches!(err, Error::KernelFormat { .. }), "{err}");
    }

    #[test]
    fn wrong_files_are_named_and_explained() {
        let missing = load_vmlinux(&mem(), Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/vmlinux"), "{missing}");
        let mut bz = vec![0u8; 600];
        bz[..2].copy_from_slice(b"MZ");
        let err = load_vmlinux(&mem(), file_with(&bz).path()).unwrap_err();
        assert!(err.to_string().contains("bzImage"), "{err}");
        let mut arm = tiny_elf(0x100_0000, &[0]);
        arm[18..20].copy_from_slice(&183u16.to_le_bytes());
        let err = load_vmlinux(&mem(), file_with(&arm).path()).unwrap_err();
        assert!(err.to_string().contains("machine 183"), "{err}");
        let err = load_vmlinux(&mem(), file_with(b"\x7fEL").path()).unwrap_err();
        assert!(err.to_string().contains("too short"), "{err}");
    }
}
