//! `stats`: containers' resource usage from `ListContainerStats`. JSON and YAML print one
//! sample; the table takes two samples `--seconds` apart for the CPU percentage, as crictl
//! does, and `-w` repeats it until interrupted.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::cri::{ContainerStats, ContainerStatsFilter, RemoteRuntime, RuntimeService};

use super::args::{ListOutput, StatsArgs};
use super::filter::parse_labels;
use super::format::{human_size, truncate_id};
use super::output::{out, print_list};
use super::table::Table;
use super::wire;

/// How often `-w` redraws.
const WATCH_PERIOD: Duration = Duration::from_millis(500);

fn id_of(s: &ContainerStats) -> &str {
    s.attributes.as_ref().map_or("", |a| a.id.as_str())
}

async fn sample(
    rt: &RemoteRuntime,
    filter: &ContainerStatsFilter,
) -> anyhow::Result<Vec<ContainerStats>> {
    let mut stats = rt
        .list_container_stats(filter.clone())
        .await
        .context("list container stats")?;
    stats.sort_by(|a, b| id_of(a).cmp(id_of(b)));
    Ok(stats)
}

/// The table of the second sample against the first.
pub fn stats_table(
    old: &[ContainerStats],
    new: &[ContainerStats],
    all: bool,
) -> anyhow::Result<String> {
    let old: HashMap<&str, &ContainerStats> = old.iter().map(|s| (id_of(s), s)).collect();
    let mut t = Table::new(&[
        "CONTAINER",
        "NAME",
        "CPU %",
        "MEM",
        "DISK",
        "INODES",
        "SWAP",
    ]);
    for s in new {
        let cpu = s.cpu.and_then(|c| c.usage_core_nano_seconds).unwrap_or(0);
        let mem = s.memory.and_then(|m| m.working_set_bytes).unwrap_or(0);
        if !all && cpu == 0 && mem == 0 {
            // not running
            continue;
        }
        let Some(prev) = old.get(id_of(s)) else {
            // appeared between the samples
            continue;
        };
        let mut percent = 0.0;
        if cpu != 0 {
            let now = s.cpu.map_or(0, |c| c.timestamp);
            let then = prev.cpu.map_or(0, |c| c.timestamp);
            let elapsed = now - then;
            if elapsed == 0 {
                bail!("cpu stat is not updated during sample");
            }
            let before = prev
                .cpu
                .and_then(|c| c.usage_core_nano_seconds)
                .unwrap_or(0);
            percent = cpu.wrapping_sub(before) as f64 / elapsed as f64 * 100.0;
        }
        let layer = s.writable_layer.as_ref();
        t.row(vec![
            truncate_id(id_of(s), "").to_string(),
            s.attributes
                .as_ref()
                .map(|a| a.metadata.name.clone())
                .unwrap_or_default(),
            format!("{percent:.2}"),
            human_size(mem as f64),
            human_size(layer.and_then(|l| l.used_bytes).unwrap_or(0) as f64),
            layer.and_then(|l| l.inodes_used).unwrap_or(0).to_string(),
            human_size(s.swap.and_then(|w| w.swap_usage_bytes).unwrap_or(0) as f64),
        ]);
    }
    Ok(t.render())
}

/// `stats`.
pub(super) async fn stats(rt: &RemoteRuntime, a: StatsArgs) -> anyhow::Result<ExitCode> {
    let filter = ContainerStatsFilter {
        id: a.id.clone().or(a.container.clone()),
        pod_sandbox_id: a.pod.clone(),
        labels: parse_labels(&a.label)?,
    };
    if a.output != ListOutput::Table {
        let s = sample(rt, &filter).await?;
        print_list(
            "stats",
            s.iter().map(wire::container_stats).collect(),
            a.output == ListOutput::Yaml,
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let period = Duration::from_secs(a.seconds);
    let clear = std::io::stdout().is_terminal();
    loop {
        let first = sample(rt, &filter).await?;
        tokio::time::sleep(period).await;
        let second = sample(rt, &filter).await?;
        let table = stats_table(&first, &second, a.all)?;
        // crictl clears the screen before every table; kruised only on a terminal
        out(&format!(
            "{}{table}",
            if clear { "\x1b[2J\x1b[H" } else { "" }
        ))?;
        if !a.watch {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            () = tokio::time::sleep(WATCH_PERIOD) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{
        ContainerAttributes, ContainerMetadata, CpuUsage, FilesystemUsage, MemoryUsage,
    };

    fn s(id: &str, ts: i64, cpu: u64, mem: u64) -> ContainerStats {
        ContainerStats {
            attributes: Some(ContainerAttributes {
                id: id.into(),
                metadata: ContainerMetadata {
                    name: format!("n-{id}"),
                    attempt: 0,
                },
                ..Default::default()
            }),
            cpu: Some(CpuUsage {
                timestamp: ts,
                usage_core_nano_seconds: Some(cpu),
                ..Default::default()
            }),
            memory: Some(MemoryUsage {
                timestamp: ts,
                working_set_bytes: Some(mem),
                ..Default::default()
            }),
            writable_layer: Some(FilesystemUsage {
                used_bytes: Some(8192),
                inodes_used: Some(5),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn cpu_percent_is_the_usage_between_samples() {
        let old = vec![s("a", 1_000_000_000, 100, 475_136), s("b", 0, 0, 0)];
        let new = vec![
            s("a", 2_000_000_000, 500_000_100, 475_136),
            s("b", 0, 0, 0),
            s("c", 2_000_000_000, 10, 10),
        ];
        let t = stats_table(&old, &new, false).unwrap();
        assert_eq!(
            t,
            "CONTAINER           NAME                CPU %               MEM                 DISK                INODES              SWAP\n\
             a                   n-a                 50.00               475.1kB             8.192kB             5                   0B\n"
        );
        // -a keeps the stopped one; a container missing from the first sample never shows
        let t = stats_table(&old, &new, true).unwrap();
        assert!(t.contains("\nb "), "{t}");
        assert!(!t.contains("\nc "), "{t}");
    }

    #[test]
    fn a_cpu_sample_that_did_not_move_is_an_error() {
        let old = vec![s("a", 5, 100, 1)];
        let new = vec![s("a", 5, 200, 1)];
        assert!(stats_table(&old, &new, false).is_err());
    }
}
