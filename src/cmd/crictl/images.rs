//! Image commands: `images`, `inspecti`, `imagefsinfo`, `pull` and `rmi`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};

use crate::cri::{
    ContainerFilter, Image, ImageService, PullAuth, PullRequest, RemoteRuntime, RuntimeService,
};

use super::args::{ImagefsinfoArgs, ImagesArgs, InspectiArgs, PullArgs, RmiArgs, StatusOutput};
use super::containers::{go_map, one_or_many, status_object};
use super::filter::{filter_images, parse_image_filters, sort_images};
use super::format::{human_size, human_size_with_precision, truncate_id};
use super::json::Json;
use super::output::{err_out, ids_to_inspect, out, print_doc, print_list};
use super::table::Table;
use super::wire;

/// `pull` without `--pull-timeout`: crictl waits as long as the pull takes; the client needs
/// a limit, so "no limit" is a day.
const PULL_NO_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// The repository and digest of an image's first repo digest (`<none>` when it has none).
fn repo_digest(i: &Image) -> (String, String) {
    match i.repo_digests.first() {
        None => ("<none>".into(), "<none>".into()),
        Some(d) => match d.split('@').collect::<Vec<_>>().as_slice() {
            [repo, digest] => ((*repo).to_string(), (*digest).to_string()),
            _ => ("errorName".into(), "errorRepoDigest".into()),
        },
    }
}

/// The (repository, tag) rows of an image: one per tag, or one `<none>` row.
fn repo_tag_pairs(i: &Image, image_name: &str) -> Vec<(String, String)> {
    if i.repo_tags.is_empty() {
        return vec![(image_name.to_string(), "<none>".into())];
    }
    i.repo_tags
        .iter()
        .map(|t| match t.rfind(':') {
            Some(idx) => {
                let name = &t[..idx];
                let name = if name == "<none>" { image_name } else { name };
                (name.to_string(), t[idx + 1..].to_string())
            }
            None => ("errorRepoTag".into(), "errorRepoTag".into()),
        })
        .collect()
}

/// The images a listing shows, sorted and filtered as crictl does.
async fn list_images(
    rt: &RemoteRuntime,
    name: Option<&str>,
    filters: &[String],
) -> anyhow::Result<Vec<Image>> {
    let filters = parse_image_filters(filters)?;
    let mut list = match name {
        Some(n) => rt.list_images_matching(n).await,
        None => rt.list_images().await,
    }
    .context("call list images RPC")?;
    tracing::debug!(count = list.len(), "ListImages response");
    sort_images(&mut list);
    Ok(filter_images(list, &filters))
}

/// `images`.
pub(super) async fn images(rt: &RemoteRuntime, a: ImagesArgs) -> anyhow::Result<ExitCode> {
    let list = list_images(rt, a.image.as_deref(), &a.filter)
        .await
        .context("listing images")?;
    if a.output == "json" || a.output == "yaml" {
        print_list(
            "images",
            list.iter().map(wire::image).collect(),
            a.output == "yaml",
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    if a.quiet {
        out(&list
            .iter()
            .map(|i| format!("{}\n", i.id))
            .collect::<String>())?;
        return Ok(ExitCode::SUCCESS);
    }
    if a.verbose {
        let mut s = String::new();
        for i in &list {
            s.push_str(&format!("ID: {}\n", i.id));
            for t in &i.repo_tags {
                s.push_str(&format!("RepoTags: {t}\n"));
            }
            for d in &i.repo_digests {
                s.push_str(&format!("RepoDigests: {d}\n"));
            }
            if i.size != 0 {
                s.push_str(&format!("Size: {}\n", i.size));
            }
            if let Some(uid) = i.uid {
                s.push_str(&format!("Uid: value:{uid}\n"));
            }
            if !i.username.is_empty() {
                s.push_str(&format!("Username: {}\n", i.username));
            }
            if i.pinned {
                s.push_str("Pinned: true\n");
            }
            s.push('\n');
        }
        out(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut header = vec!["IMAGE", "TAG"];
    if a.digests {
        header.push("DIGEST");
    }
    header.extend(["IMAGE ID", "SIZE"]);
    if a.pinned {
        header.push("PINNED");
    }
    let mut t = Table::new(&header);
    for i in &list {
        let (name, mut digest) = repo_digest(i);
        let mut id = i.id.clone();
        if !a.no_trunc {
            id = truncate_id(&id, "sha256:").to_string();
            digest = truncate_id(&digest, "sha256:").to_string();
        }
        let size = human_size_with_precision(i.size as f64, 3);
        for (repo, tag) in repo_tag_pairs(i, &name) {
            let mut row = vec![repo, tag];
            if a.digests {
                row.push(digest.clone());
            }
            row.extend([id.clone(), size.clone()]);
            if a.pinned {
                row.push(i.pinned.to_string());
            }
            t.row(row);
        }
    }
    out(&t.render())?;
    Ok(ExitCode::SUCCESS)
}

fn image_table(i: &Image, info: &crate::cri::StringMap, verbose: bool) -> String {
    let mut s = format!("ID: {}\n", i.id);
    for t in &i.repo_tags {
        s.push_str(&format!("Tag: {t}\n"));
    }
    for d in &i.repo_digests {
        s.push_str(&format!("Digest: {d}\n"));
    }
    s.push_str(&format!(
        "Size: {}\n",
        human_size_with_precision(i.size as f64, 3)
    ));
    if verbose && !info.is_empty() {
        s.push_str(&format!("Info: {}\n", go_map(info)));
    }
    s
}

/// `inspecti`.
pub(super) async fn inspecti(rt: &RemoteRuntime, a: InspectiArgs) -> anyhow::Result<ExitCode> {
    let listed = async {
        anyhow::Ok(
            list_images(rt, None, &a.filter)
                .await
                .context("listing images")?
                .into_iter()
                .map(|i| i.id)
                .collect(),
        )
    };
    let Some(ids) = ids_to_inspect(&a.ids, listed).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    let verbose = !a.quiet;
    let mut found = Vec::new();
    for id in &ids {
        let (image, info) = rt
            .image_status_verbose(id, verbose)
            .await
            .with_context(|| format!("image status for {id:?} request"))?
            .ok_or_else(|| anyhow!("no such image {id:?} present"))?;
        found.push((image, info));
    }
    match a.output {
        StatusOutput::Table => out(&found
            .iter()
            .map(|(i, info)| image_table(i, info, verbose))
            .collect::<String>())?,
        StatusOutput::Json | StatusOutput::Yaml => {
            let docs = found
                .iter()
                .map(|(i, info)| status_object(wire::image(i), info))
                .collect();
            print_doc(&one_or_many(docs), a.output == StatusOutput::Yaml, true)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `imagefsinfo`.
pub(super) async fn imagefsinfo(
    rt: &RemoteRuntime,
    a: ImagefsinfoArgs,
) -> anyhow::Result<ExitCode> {
    let info = rt
        .image_fs_info_full()
        .await
        .context("image filesystem info")?;
    if a.output == StatusOutput::Table {
        let mut s = String::new();
        for (label, list) in [
            ("Container", &info.container_filesystems),
            ("Image", &info.image_filesystems),
        ] {
            s.push_str(&format!("{label} Filesystem \n"));
            for (i, f) in list.iter().enumerate() {
                s.push_str(&format!("TimeStamp[{i}]: {}\n", f.timestamp));
                s.push_str(&format!(
                    "Disk[{i}]: {}\n",
                    human_size(f.used_bytes.unwrap_or(0) as f64)
                ));
                s.push_str(&format!("Inodes[{i}]: {}\n", f.inodes_used.unwrap_or(0)));
                s.push_str(&format!("Mountpoint[{i}]: {}\n", f.mountpoint));
            }
        }
        out(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    let fs = |v: &[crate::cri::FilesystemUsage]| {
        Json::Arr(v.iter().map(wire::filesystem_usage).collect())
    };
    let status = Json::obj(vec![
        ("imageFilesystems", fs(&info.image_filesystems)),
        ("containerFilesystems", fs(&info.container_filesystems)),
    ]);
    let doc = Json::obj(vec![("status", status)]);
    print_doc(&doc, a.output == StatusOutput::Yaml, true)?;
    Ok(ExitCode::SUCCESS)
}

/// The credentials of `--creds USER[:PASSWORD]` or `--auth BASE64`.
fn pull_auth(creds: Option<&str>, auth: Option<&str>) -> anyhow::Result<Option<PullAuth>> {
    match (creds, auth) {
        (Some(_), Some(_)) => bail!("both `--creds` and `--auth` are specified"),
        (Some(""), None) => bail!("credentials can't be empty"),
        (Some(c), None) => {
            let (user, password) = c.split_once(':').unwrap_or((c, ""));
            if user.is_empty() {
                bail!("username can't be empty");
            }
            Ok(Some(PullAuth {
                username: user.to_string(),
                password: password.to_string(),
                ..Default::default()
            }))
        }
        (None, Some(a)) => Ok(Some(PullAuth {
            auth: a.to_string(),
            ..Default::default()
        })),
        (None, None) => Ok(None),
    }
}

/// `pull`.
pub(super) async fn pull(rt: &RemoteRuntime, a: PullArgs) -> anyhow::Result<ExitCode> {
    if a.image.is_empty() {
        bail!("image name cannot be empty");
    }
    let auth = pull_auth(a.creds.as_deref(), a.auth.as_deref())?;
    let timeout = if a.pull_timeout.is_zero() {
        PULL_NO_LIMIT
    } else {
        a.pull_timeout
    };
    let image_ref = rt
        .pull_image(
            PullRequest {
                image: a.image.clone(),
                auth,
                sandbox: None,
            },
            timeout,
        )
        .await
        .context("pulling image")?;
    out(&format!("Image is up to date for {image_ref}\n"))?;
    Ok(ExitCode::SUCCESS)
}

/// Whether an argument of `rmi` names a tag or repository rather than an ID.
fn looks_like_tag(arg: &str) -> bool {
    !arg.starts_with("sha256:") && (arg.contains(':') || arg.contains('/'))
}

/// `rmi`.
pub(super) async fn rmi(rt: &RemoteRuntime, a: RmiArgs) -> anyhow::Result<ExitCode> {
    // true: remove; false: in use (prune keeps it)
    let mut ids: BTreeMap<String, bool> = a.ids.iter().map(|i| (i.clone(), true)).collect();
    if a.all || a.prune {
        for i in rt.list_images().await.context("list images")? {
            if a.prune && i.pinned {
                continue;
            }
            ids.insert(i.id, true);
        }
    }
    if a.prune {
        let containers = rt
            .list_containers(ContainerFilter::default())
            .await
            .context("list containers")?;
        for c in containers {
            if let Ok(Some(i)) = rt.image_status(&c.image).await {
                ids.insert(i.id, false);
            }
        }
    }
    if ids.is_empty() {
        if a.all || a.prune {
            err_out(b"No images to remove\n");
            return Ok(ExitCode::SUCCESS);
        }
        bail!("no image given: rmi IMAGE-ID [IMAGE-ID...], or --all, or --prune");
    }
    let mut failures = Vec::new();
    for (id, remove) in ids {
        if !remove {
            continue;
        }
        let status = match rt.image_status(&id).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                failures.push(format!("no such image {id}"));
                continue;
            }
            Err(e) => {
                failures.push(format!("image status request for {id:?} failed: {e}"));
                continue;
            }
        };
        if status.repo_tags.len() > 1 && looks_like_tag(&id) {
            let mut w = format!(
                "warning: image {id:?} has multiple tags. Removing this image will delete all of \
                 the following tags:\n"
            );
            for t in &status.repo_tags {
                w.push_str(&format!("  {t}\n"));
            }
            err_out(w.as_bytes());
        }
        if let Err(e) = rt.remove_image(&id).await {
            if !a.prune {
                failures.push(format!("error of removing image {id:?}: {e}"));
            }
            continue;
        }
        let deleted = if status.repo_tags.is_empty() {
            &status.repo_digests
        } else {
            &status.repo_tags
        };
        out(&deleted
            .iter()
            .map(|t| format!("Deleted: {t}\n"))
            .collect::<String>())?;
    }
    if !failures.is_empty() {
        bail!(failures.join("; "));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(tags: &[&str], digests: &[&str]) -> Image {
        Image {
            id: "sha256:1".into(),
            repo_tags: tags.iter().map(|s| s.to_string()).collect(),
            repo_digests: digests.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn tags_split_at_the_last_colon_and_untagged_images_show_their_repository() {
        let i = image(
            &["127.0.0.1:5200/test/busybox:v1", "r/x:latest"],
            &["127.0.0.1:5200/test/busybox@sha256:c6"],
        );
        let (name, digest) = repo_digest(&i);
        assert_eq!(digest, "sha256:c6");
        assert_eq!(
            repo_tag_pairs(&i, &name),
            vec![
                ("127.0.0.1:5200/test/busybox".into(), "v1".into()),
                ("r/x".into(), "latest".into())
            ]
        );
        let untagged = image(&[], &["127.0.0.1:5200/test/pull@sha256:6e"]);
        let (name, _) = repo_digest(&untagged);
        assert_eq!(
            repo_tag_pairs(&untagged, &name),
            vec![("127.0.0.1:5200/test/pull".into(), "<none>".into())]
        );
        assert_eq!(repo_digest(&image(&[], &[])).0, "<none>");
    }

    #[test]
    fn credentials_are_user_and_optional_password_or_an_auth_string() {
        let a = pull_auth(Some("u:p:w"), None).unwrap().unwrap();
        assert_eq!((a.username.as_str(), a.password.as_str()), ("u", "p:w"));
        let a = pull_auth(Some("u"), None).unwrap().unwrap();
        assert_eq!(a.password, "");
        assert!(pull_auth(Some(":p"), None).is_err());
        assert!(pull_auth(Some("u:p"), Some("x")).is_err());
        assert_eq!(pull_auth(None, Some("dTpw")).unwrap().unwrap().auth, "dTpw");
        assert!(pull_auth(None, None).unwrap().is_none());
    }

    #[test]
    fn rmi_warns_only_for_tags() {
        assert!(looks_like_tag("127.0.0.1:5200/test/busybox:v1"));
        assert!(looks_like_tag("library/busybox"));
        assert!(!looks_like_tag("sha256:6edf"));
        assert!(!looks_like_tag("6edf3ef45fce"));
    }
}
