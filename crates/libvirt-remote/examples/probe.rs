//! Opens the local libvirtd and prints what it says: `cargo run --example probe [SOCKET]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use libvirt_remote::{Client, OpenOptions, transport};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| transport::DEFAULT_SOCKET.into());
    let t = transport::unix::connect(&path, transport::DEFAULT_DIAL_TIMEOUT).await?;
    let c = Client::open(t, OpenOptions::default()).await?;
    println!("hostname: {}", c.hostname().await?);
    println!("libvirt: {}", c.lib_version().await?);
    println!("hypervisor: {}", c.hypervisor_version().await?);
    println!("keepalive feature: {}", c.supports_feature(10).await?);
    println!(
        "domains: {:?}",
        c.list_all_domains(0)
            .await?
            .iter()
            .map(|d| &d.name)
            .collect::<Vec<_>>()
    );
    let caps = c
        .domain_capabilities(None, Some("x86_64"), None, Some("qemu"))
        .await?;
    println!("domcaps: {} bytes", caps.len());
    match c.domain_lookup_by_name("nope-does-not-exist").await {
        Err(e) => println!(
            "lookup missing: code {:?} remote {:?}",
            e.libvirt_code(),
            e.remote()
        ),
        Ok(_) => println!("??"),
    }
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    println!(
        "stats after 12s idle: {:?} alive {}",
        c.connection().stats(),
        c.connection().is_alive()
    );
    c.close_by(tokio::time::Instant::now() + std::time::Duration::from_secs(1))
        .await;
    Ok(())
}
