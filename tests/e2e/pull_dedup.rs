//! One transfer or two (issue 41): what the runtime does when the kubelet's `PullImage` arrives
//! while another pull of the same image is in flight (kruised's in-place pull), counted in the
//! bytes the registry sent through a relay. containerd 1.6 and 2.x move the layer once: the
//! second call waits for the first's blob and returns with it (`docs/runtimes.md`). CRI-O is read
//! from its source there, not asserted here.

use std::time::Duration;

use crate::support::tcp_relay::TcpRelay;
use crate::support::{Lab, LabRuntime, within};
use kruised::cri::{ImageService, PullRequest};

const LIMIT: Duration = Duration::from_secs(60);
/// `cri-lab.sh bench-images`: the busybox base plus one 16 MiB layer of random bytes, an image
/// no other test pulls.
const LAYER: u64 = 16 << 20;

#[tokio::test]
async fn a_second_pull_of_an_image_whose_pull_is_in_flight_moves_its_layer_once_on_containerd() {
    let Some(lab) = Lab::get() else { return };
    if lab.runtime == LabRuntime::Crio {
        eprintln!("SKIPPED: CRI-O's answer is read from its source (docs/runtimes.md)");
        return;
    }
    lab.script("bench-images");
    // the registry through a relay at 16 MiB/s: the layer takes about a second
    let relay = TcpRelay::start(lab.registry.parse().unwrap()).await;
    relay.limit(Some(LAYER), None);
    let hosts = lab.dir.join("certs.d").join(relay.addr.to_string());
    std::fs::create_dir_all(&hosts).unwrap();
    let addr = relay.addr;
    std::fs::write(
        hosts.join("hosts.toml"),
        format!("server = \"http://{addr}\"\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"),
    )
    .unwrap();
    let image = format!("{addr}/bench/img4:v1");
    let runtime = lab.runtime();
    let pull = || {
        let request = PullRequest {
            image: image.clone(),
            ..Default::default()
        };
        runtime.pull_image(request, LIMIT)
    };

    // bench-images made the layer anew: no runtime has it
    let _ = runtime.remove_image(&image).await;
    let first = pull();
    let second = async {
        // the first pull has moved part of the layer: it is in flight
        relay
            .wait_until("the first MiB of the layer", LIMIT, |s| {
                s.bytes_down > 1 << 20
            })
            .await;
        pull().await
    };
    let (a, b) = within(LIMIT, "both pulls", async { tokio::join!(first, second) }).await;
    let sent = relay.stats().bytes_down;
    let _ = runtime.remove_image(&image).await;
    let _ = std::fs::remove_dir_all(&hosts);
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "both pulls answer the same image");
    assert!(
        (LAYER..LAYER + LAYER / 2).contains(&sent),
        "one transfer of the {LAYER}-byte layer (with the manifest and config), not two: the \
         registry sent {sent} bytes"
    );
}
