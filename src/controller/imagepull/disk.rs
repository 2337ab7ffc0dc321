//! The disk check before a pull (kruise #1995: pre-pulls must not fill the node's disk).
//!
//! CRI `ImageFsInfo` reports the bytes *used* by images and the filesystem's mount point, not
//! the free space. The free space comes from `statvfs` on that mount point (blocks available to
//! unprivileged users × fragment size), when the daemon can see the path: on a bare-metal node
//! it can; in a DaemonSet only if the image filesystem (e.g. `/var/lib/containerd`) is mounted
//! at the same path. When it cannot, the check is skipped with a debug log: the daemon never
//! fails a pull because it cannot tell.

use std::path::Path;

use crate::cri::FilesystemUsage;

/// What the image filesystem looks like now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFs {
    /// The mount point the runtime reported.
    pub mountpoint: String,
    /// Bytes used by images, as the runtime reports them.
    pub used_bytes: Option<u64>,
    /// Bytes available, if the mount point is visible here.
    pub free_bytes: Option<u64>,
}

/// Free and total bytes of a filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space {
    /// Bytes available to unprivileged users (`f_bavail × f_frsize`).
    pub free: u64,
    /// Bytes of the filesystem (`f_blocks × f_frsize`).
    pub capacity: u64,
}

/// Free and total bytes of the filesystem holding `path`, or `None` when the path cannot be
/// examined (the size admission, `admit.rs`).
pub fn space(path: &Path) -> Option<Space> {
    let st = rustix::fs::statvfs(path).ok()?;
    Some(Space {
        free: st.f_bavail.saturating_mul(st.f_frsize),
        capacity: st.f_blocks.saturating_mul(st.f_frsize),
    })
}

/// Free bytes of the filesystem holding `path` (`statvfs`: `f_bavail × f_frsize`), or `None`
/// when the path cannot be examined.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(path).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The first image filesystem the runtime reports, with its free space if visible.
pub fn image_fs(usage: &[FilesystemUsage], free: impl Fn(&Path) -> Option<u64>) -> Option<ImageFs> {
    let fs = usage.first()?;
    let free_bytes = (!fs.mountpoint.is_empty())
        .then(|| free(Path::new(&fs.mountpoint)))
        .flatten();
    Some(ImageFs {
        mountpoint: fs.mountpoint.clone(),
        used_bytes: fs.used_bytes,
        free_bytes,
    })
}

/// The message of a pull refused for lack of space, or `None` when there is room (or the free
/// space is unknown, or the floor is 0).
pub fn refusal(fs: &ImageFs, floor: u64) -> Option<String> {
    let free = fs.free_bytes?;
    (floor > 0 && free < floor).then(|| {
        format!(
            "not pulling: the image filesystem {} has {} free, less than the {} the daemon keeps \
             free (--image-fs-min-free)",
            fs.mountpoint,
            human(free),
            human(floor)
        )
    })
}

/// Bytes in binary units with one decimal (`1.5 GiB`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(mountpoint: &str) -> Vec<FilesystemUsage> {
        vec![FilesystemUsage {
            timestamp: 0,
            mountpoint: mountpoint.into(),
            used_bytes: Some(10),
            inodes_used: None,
        }]
    }

    #[test]
    fn statvfs_reads_the_free_space_of_a_visible_path() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).is_some_and(|b| b > 0));
        assert_eq!(free_bytes(Path::new("/no/such/path/anywhere")), None);
        let space = space(dir.path()).unwrap();
        assert!(space.capacity >= space.free && space.free > 0, "{space:?}");
        assert_eq!(super::space(Path::new("/no/such/path/anywhere")), None);
    }

    #[test]
    fn below_the_floor_is_refused_with_both_numbers() {
        let fs = image_fs(&usage("/var/lib/containerd"), |_| Some(100 << 20)).unwrap();
        assert_eq!(fs.free_bytes, Some(100 << 20));
        let msg = refusal(&fs, 1 << 30).unwrap();
        assert!(msg.contains("/var/lib/containerd"), "{msg}");
        assert!(
            msg.contains("100.0 MiB") && msg.contains("1.0 GiB"),
            "{msg}"
        );
        assert_eq!(refusal(&fs, 50 << 20), None);
        assert_eq!(refusal(&fs, 0), None, "a floor of 0 is off");
    }

    #[test]
    fn an_invisible_mount_point_skips_the_check() {
        let fs = image_fs(&usage("/var/lib/containerd"), |_| None).unwrap();
        assert_eq!(refusal(&fs, u64::MAX), None);
        let fs = image_fs(&usage(""), |_| Some(0)).unwrap();
        assert_eq!(fs.free_bytes, None);
        assert_eq!(image_fs(&[], |_| Some(0)), None);
    }

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
