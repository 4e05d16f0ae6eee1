//! The benchmark driver behind `scripts/bench` (which compares it with virsh and prints the
//! ratios). Subcommands:
//!   upload   CONN --pool P --name V --file F [--chunk BYTES] [--keep] [--mem | --tokio-file]
//!            (the volume is deleted after the upload unless --keep; the file is read with
//!            `vol_upload_file`, or through tokio's File, or from memory)
//!   define   CONN --prefix X --count N        (N inactive TCG domains with metadata)
//!   metadata CONN --prefix X --expect N       (list all, then read every metadata, pipelined)
//!   cleanup  CONN --prefix X                  (undefine every domain named X-*)
//! CONN is `--unix [--socket PATH]` or `--host H --port P --user U --key K --known-hosts F
//! [--cipher C] [--socket PATH]`, optionally `--uri URI` (default `qemu:///system`; a private
//! session daemon is `qemu:///session`). Prints the elapsed seconds of the measured part on
//! stdout's last line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::time::Instant;

use futures_util::stream::{self, StreamExt};
use libvirt_remote::{Client, OpenOptions, UploadOptions, transport};

const BENCH_NS: &str = "https://egress-proxies.dev/bench";
/// Calls in flight at once for the pipelined phases.
const PIPELINE: usize = 128;

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn parse(args: &[String]) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        if let Some(k) = a.strip_prefix("--") {
            let v = match it.peek() {
                Some(n) if !n.starts_with("--") => it.next().cloned().unwrap_or_default(),
                _ => String::new(),
            };
            m.insert(k.to_string(), v);
        }
    }
    m
}

async fn connect(o: &HashMap<String, String>) -> AnyResult<Client> {
    let t = if o.contains_key("unix") {
        let path = o
            .get("socket")
            .cloned()
            .unwrap_or_else(|| transport::DEFAULT_SOCKET.into());
        transport::unix::connect(path, transport::DEFAULT_DIAL_TIMEOUT).await?
    } else {
        ssh_transport(o).await?
    };
    let mut open = OpenOptions::default();
    if let Some(uri) = o.get("uri") {
        open.uri = uri.clone();
    }
    Ok(Client::open(t, open).await?)
}

async fn ssh_transport(o: &HashMap<String, String>) -> AnyResult<transport::Transport> {
    use transport::ssh::{ClientKey, HostKeySource, SshOptions, SshTarget};
    let get = |k: &str| o.get(k).cloned().ok_or_else(|| format!("missing --{k}"));
    let target = SshTarget::new(
        get("host")?,
        get("user")?,
        HostKeySource::KnownHostsFile(get("known-hosts")?.into()),
        ClientKey::from_file(get("key")?),
    )
    .with_port(get("port")?.parse()?);
    let target = match o.get("socket") {
        Some(s) => target.with_socket_path(s.clone()),
        None => target,
    };
    let mut opts = SshOptions::default();
    if let Some(c) = o.get("cipher") {
        opts.ciphers = vec![c.clone()];
    }
    Ok(transport::ssh::connect(&target, &opts).await?)
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().cloned().unwrap_or_default();
    let o = parse(args.get(1..).unwrap_or_default());
    let client = connect(&o).await?;
    match cmd.as_str() {
        // NB: the upload runs as a task on the runtime's workers, as it does in the operator,
        // not on the main thread that `block_on` drives.
        "upload" => {
            let (c, o) = (client.clone(), o.clone());
            tokio::spawn(async move { upload(&c, &o).await }).await??
        }
        "define" => define(&client, &o).await?,
        "metadata" => metadata(&client, &o).await?,
        "cleanup" => cleanup(&client, &o).await?,
        other => return Err(format!("unknown subcommand {other:?}").into()),
    }
    client.close();
    Ok(())
}

async fn upload(c: &Client, o: &HashMap<String, String>) -> AnyResult<()> {
    let pool = c.pool_lookup_by_name(&o["pool"]).await?;
    let name = &o["name"];
    let file = &o["file"];
    let size = std::fs::metadata(file)?.len();
    if let Ok(v) = c.vol_lookup_by_name(&pool, name).await {
        c.vol_delete(&v, 0).await?;
    }
    let xml = format!(
        "<volume><name>{name}</name><capacity unit='bytes'>{size}</capacity>\
         <target><format type='raw'/></target></volume>"
    );
    let vol = c.vol_create_xml(&pool, &xml, 0).await?;
    let mut opts = UploadOptions::default();
    if let Some(ch) = o.get("chunk") {
        opts.chunk_size = ch.parse()?;
    }
    let (start, cpu0);
    let hwm0 = vm_hwm_kib();
    let n = if o.contains_key("mem") {
        let data = std::fs::read(file)?;
        (start, cpu0) = (Instant::now(), cpu_secs());
        c.vol_upload(&vol, 0, size, &data[..], &opts).await?
    } else if o.contains_key("tokio-file") {
        let src = tokio::fs::File::open(file).await?;
        (start, cpu0) = (Instant::now(), cpu_secs());
        c.vol_upload(&vol, 0, size, src, &opts).await?
    } else {
        let src = std::fs::File::open(file)?;
        (start, cpu0) = (Instant::now(), cpu_secs());
        c.vol_upload_file(&vol, 0, size, src, &opts).await?
    };
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu0;
    let hwm1 = vm_hwm_kib();
    assert_eq!(n, size, "short upload");
    if !o.contains_key("keep") {
        c.vol_delete(&vol, 0).await?;
    }
    eprintln!(
        "uploaded {n} bytes in {secs:.3} s ({:.1} MiB/s), {cpu:.2} s CPU in this process, \
         peak RSS {} -> {} MiB (+{} MiB)",
        n as f64 / secs / 1048576.0,
        hwm0 / 1024,
        hwm1 / 1024,
        hwm1.saturating_sub(hwm0) / 1024
    );
    println!("{secs:.3}");
    Ok(())
}

/// This process's peak resident set (VmHWM), KiB.
fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of this process (all threads), from /proc/self/stat.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5), 12 and 13 after the name.
    let ticks: u64 = f
        .get(11..13)
        .map_or(0, |t| t.iter().filter_map(|x| x.parse::<u64>().ok()).sum());
    ticks as f64 / 100.0
}

async fn define(c: &Client, o: &HashMap<String, String>) -> AnyResult<()> {
    let prefix = &o["prefix"];
    let count: usize = o["count"].parse()?;
    let start = Instant::now();
    let results: Vec<_> = stream::iter(0..count)
        .map(|i| {
            let xml = format!(
                "<domain type='qemu'><name>{prefix}-{i}</name><memory unit='MiB'>32</memory>\
                 <vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os>\
                 <metadata><b:bench xmlns:b='{BENCH_NS}'>{i}</b:bench></metadata></domain>"
            );
            async move { c.domain_define_xml(&xml, 0).await }
        })
        .buffer_unordered(PIPELINE)
        .collect()
        .await;
    for r in results {
        r?;
    }
    eprintln!("defined {count} domains");
    println!("{:.3}", start.elapsed().as_secs_f64());
    Ok(())
}

async fn metadata(c: &Client, o: &HashMap<String, String>) -> AnyResult<()> {
    let prefix = format!("{}-", o["prefix"]);
    let expect: usize = o["expect"].parse()?;
    let start = Instant::now();
    let doms: Vec<_> = c
        .list_all_domains(0)
        .await?
        .into_iter()
        .filter(|d| d.name.starts_with(&prefix))
        .collect();
    let reads: Vec<_> = stream::iter(doms.iter())
        .map(|d| c.domain_metadata(d, BENCH_NS, 0))
        .buffer_unordered(PIPELINE)
        .collect()
        .await;
    let secs = start.elapsed().as_secs_f64();
    let ok = reads.iter().filter(|r| r.is_ok()).count();
    if ok != expect {
        return Err(format!(
            "read {ok} metadata of {} domains, expected {expect}",
            doms.len()
        )
        .into());
    }
    eprintln!(
        "listed {} domains and read {ok} metadata in {secs:.3} s",
        doms.len()
    );
    println!("{secs:.3}");
    Ok(())
}

async fn cleanup(c: &Client, o: &HashMap<String, String>) -> AnyResult<()> {
    let prefix = format!("{}-", o["prefix"]);
    let doms: Vec<_> = c
        .list_all_domains(0)
        .await?
        .into_iter()
        .filter(|d| d.name.starts_with(&prefix))
        .collect();
    let n = doms.len();
    let _: Vec<_> = stream::iter(doms.iter())
        .map(|d| async move {
            let _ = c.domain_destroy(d, 0).await;
            c.domain_undefine(d, libvirt_remote::client::undefine::ALL_METADATA)
                .await
        })
        .buffer_unordered(PIPELINE)
        .collect()
        .await;
    eprintln!("removed {n} domains");
    println!("0");
    Ok(())
}
