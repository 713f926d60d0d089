//! `prefixlog checkpoints list|show|verify`: inspect a replica's checkpoint store.

use prefixlog_snapshot::CheckpointStore;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The replica's --data-dir.
    #[arg(long, env = "PREFIXLOG_DATA_DIR")]
    pub data_dir: PathBuf,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// One line per checkpoint, newest first.
    List,
    /// Everything the meta says about one checkpoint.
    Show { id: u64 },
    /// Read and checksum every byte of one (or every) checkpoint; exit 1 if any fails.
    Verify { id: Option<u64> },
}

pub fn run(a: Args) -> anyhow::Result<()> {
    // A reader beside a running replica (RocksDB secondary): never disturbs it, and never
    // fails because the replica rotated its write-ahead log meanwhile.
    let store = CheckpointStore::open_reader(&a.data_dir.join("checkpoints"))?;
    match a.cmd {
        Cmd::List => {
            println!(
                "{:>6}  {:>14}  {:>12}  {:>9}  {:>17}  cluster/topic",
                "id", "log time (ms)", "holder-blks", "keyspaces", "settings"
            );
            for id in store.ids() {
                match store.meta(id) {
                    Ok(m) => println!(
                        "{:>6}  {:>14}  {:>12}  {:>9}  {:#017x}  {}/{} ({} of {} partitions)",
                        id,
                        m.log_time(),
                        m.holder_blocks(),
                        m.keyspaces.len(),
                        m.identity.settings.fingerprint(),
                        m.identity.cluster_id,
                        m.identity.topic,
                        m.identity.owned.len(),
                        m.identity.partitions
                    ),
                    Err(e) => println!("{id:>6}  UNREADABLE: {e}"),
                }
            }
        }
        Cmd::Show { id } => {
            let m = store.meta(id)?;
            println!("checkpoint {id} (format {})", m.format);
            println!("created (wall clock, unix ms): {}", m.created_unix_ms);
            println!(
                "log: cluster {:?}, topic {:?}, {} partitions, covering {:?}",
                m.identity.cluster_id, m.identity.topic, m.identity.partitions, m.identity.owned
            );
            println!("state settings: {}", m.identity.settings);
            for (p, o, t) in m.covered() {
                println!("  partition {p:>3}: next offset {o:>10}, log time {t}");
            }
            for k in &m.keyspaces {
                println!(
                    "  keyspace {}: {} holder-blocks, {} bytes in {} chunks",
                    k.id, k.holder_blocks, k.bytes, k.chunks
                );
            }
        }
        Cmd::Verify { id } => {
            let ids = id.map_or_else(|| store.ids(), |i| vec![i]);
            let mut bad = 0;
            for id in ids {
                match store.load(id) {
                    Ok(l) => println!("checkpoint {id}: OK ({} holder-blocks)", l.meta.holder_blocks()),
                    Err(e) => {
                        println!("checkpoint {id}: FAILED: {e}");
                        bad += 1;
                    }
                }
            }
            if bad > 0 {
                anyhow::bail!("{bad} checkpoint(s) failed verification");
            }
        }
    }
    Ok(())
}
