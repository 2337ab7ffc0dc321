//! A small ext4 in a file, loop-mounted: the image filesystem's stand-in where "disk full" must
//! be real (the end-to-end tests of the size admission and of pins giving way, through
//! `--image-fs-path`). Needs root and e2fsprogs (`cri-lab.sh install`): without them it says so
//! on stderr and gives `None`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use kruised::controller::imagepull::disk;

/// A small ext4 in a file, loop-mounted; unmounted when dropped.
pub struct LoopFs {
    /// Where it is mounted.
    pub mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// An ext4 of `bytes`, mounted; `None` when this process cannot mount (not root, no
    /// e2fsprogs): said on stderr.
    pub fn new(bytes: u64) -> Option<LoopFs> {
        let root = std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata("/proc/self").expect("/proc/self"),
        ) == 0;
        if !root || !Path::new("/usr/sbin/mkfs.ext4").exists() {
            eprintln!(
                "skipped: mounting a loop ext4 needs root and e2fsprogs (cri-lab.sh install)"
            );
            return None;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("imagefs.ext4");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(bytes))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
            assert!(out.status.success(), "{cmd:?}: {out:?}");
        };
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&file));
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap_or_else(|e| panic!("{}: {e}", mount.display()));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&file)
            .arg(&mount));
        Some(LoopFs { mount, _dir: dir })
    }

    /// Its free and total bytes now.
    pub fn space(&self) -> disk::Space {
        disk::space(&self.mount).expect("statvfs of the mounted ext4")
    }

    /// Writes `bytes` into a new file and syncs it: the filesystem has that much less free.
    pub fn fill(&self, name: &str, bytes: u64) {
        let path = self.mount.join(name);
        let mut f =
            std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let chunk = vec![0x5a_u8; 64 << 10];
        let mut left = bytes;
        while left > 0 {
            let n = usize::try_from(left.min(chunk.len() as u64)).expect("at most a chunk");
            f.write_all(&chunk[..n])
                .and_then(|()| f.flush())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            left -= n as u64;
        }
        f.sync_all()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}
