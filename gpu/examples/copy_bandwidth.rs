//! Copy bandwidth of page moves: GPU→host (offload) and host→GPU (reload) with scattered page
//! lists, next to one contiguous copy of the same bytes (the physical reference), with a byte-exact
//! correctness check of every move.
//!
//! ```text
//! cargo run --release -p kvsched-gpu --example copy_bandwidth -- [--pages N] [--page-kib K] [--iters I] [--host]
//! ```
//!
//! Defaults: 4096 pages of 64 KiB (256 MiB per move), 5 timed iterations after one warm-up.
//! `--host` runs the host-memory backend instead (no GPU needed). Without a CUDA driver it prints
//! the reason and exits 0; a wrong byte exits 1.

use std::process::ExitCode;
use std::time::Instant;

use kvsched_gpu::{
    open_device, page_runs, BlockTableShape, CudaKvStore, HostKvStore, KvMemory, MemError,
    PageMove, PoolShape, Tier,
};

/// A move of page `src` of tier `from` to page `dst` of the other tier (no request: a benchmark).
fn page_move(from: Tier, src: u32, dst: u32) -> PageMove {
    PageMove {
        request: Default::default(),
        from,
        src,
        dst,
    }
}

struct Args {
    pages: u32,
    page_kib: usize,
    iters: u32,
    host: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        pages: 4096,
        page_kib: 64,
        iters: 5,
        host: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--pages" => args.pages = value()?.parse().map_err(|e| format!("--pages: {e}"))?,
            "--page-kib" => {
                args.page_kib = value()?.parse().map_err(|e| format!("--page-kib: {e}"))?
            }
            "--iters" => args.iters = value()?.parse().map_err(|e| format!("--iters: {e}"))?,
            "--host" => args.host = true,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if args.pages == 0 || args.page_kib == 0 || args.iters == 0 {
        return Err("--pages, --page-kib and --iters must be positive".into());
    }
    Ok(args)
}

/// The bytes page `page` starts with: 8-byte words derived from the page id (splitmix64).
fn fill_page(page: u32, out: &mut [u8]) {
    let mut state = u64::from(page).wrapping_mul(0x2545_f491_4f6c_dd1d);
    for chunk in out.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let word = (z ^ (z >> 31)).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// A pseudo-random permutation of `0..n` (Fisher–Yates with a fixed LCG).
fn permutation(n: u32, seed: u64) -> Vec<u32> {
    let mut pages: Vec<u32> = (0..n).collect();
    let mut state = seed;
    for i in (1..pages.len()).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = ((state >> 33) % (i as u64 + 1)) as usize;
        pages.swap(i, j);
    }
    pages
}

/// Seconds of the best and the mean of `iters` timed runs (after one warm-up) of one move list.
fn time_moves<M: KvMemory>(
    mem: &mut M,
    tier_from: Tier,
    moves: &[PageMove],
    iters: u32,
) -> Result<(f64, f64), MemError> {
    let run = |mem: &mut M| match tier_from {
        Tier::Gpu => mem.offload(moves),
        Tier::Host => mem.reload(moves),
    };
    run(mem)?.wait()?;
    let (mut best, mut total) = (f64::INFINITY, 0.0);
    for _ in 0..iters {
        let start = Instant::now();
        run(mem)?.wait()?;
        let secs = start.elapsed().as_secs_f64();
        best = best.min(secs);
        total += secs;
    }
    Ok((best, total / f64::from(iters)))
}

/// Checks that page `dst` of `tier` holds the pattern of page `src`; counts pages that differ.
fn verify<M: KvMemory>(mem: &M, tier: Tier, moves: &[PageMove]) -> Result<usize, MemError> {
    let page_bytes = mem.shape().page_bytes;
    let (mut got, mut want) = (vec![0; page_bytes], vec![0; page_bytes]);
    let mut wrong = 0;
    for page_move in moves {
        mem.read_page(tier, page_move.dst, &mut got)?;
        fill_page(page_move.src, &mut want);
        wrong += usize::from(got != want);
    }
    Ok(wrong)
}

/// Makes page `p` of the `source` tier hold page `p`'s pattern and zeroes the other tier, so that a
/// copy that does nothing cannot pass the check.
fn prepare<M: KvMemory>(mem: &mut M, source: Tier) -> Result<(), MemError> {
    let shape = mem.shape();
    let zeros = vec![0; shape.page_bytes];
    let mut bytes = vec![0; shape.page_bytes];
    for page in 0..shape.host_pages {
        fill_page(page, &mut bytes);
        mem.write_page(Tier::Host, page, &bytes)?;
    }
    match source {
        Tier::Gpu => {
            let identity: Vec<PageMove> = (0..shape.gpu_pages)
                .map(|p| page_move(Tier::Host, p, p))
                .collect();
            mem.reload(&identity)?.wait()?;
            for page in 0..shape.host_pages {
                mem.write_page(Tier::Host, page, &zeros)?;
            }
        }
        Tier::Host => {
            for page in 0..shape.gpu_pages {
                mem.write_page(Tier::Gpu, page, &zeros)?;
            }
        }
    }
    Ok(())
}

fn bench<M: KvMemory>(mem: &mut M, args: &Args) -> Result<bool, MemError> {
    let shape = mem.shape();
    let bytes = shape.tier_bytes(Tier::Gpu) as f64;
    println!(
        "pages: {} x {} KiB = {:.0} MiB per move; {} timed iterations after 1 warm-up",
        shape.gpu_pages,
        args.page_kib,
        bytes / (1 << 20) as f64,
        args.iters
    );
    let gpu_order = permutation(shape.gpu_pages, 1);
    let host_order = permutation(shape.host_pages, 2);
    let scattered: Vec<PageMove> = gpu_order
        .iter()
        .zip(&host_order)
        .map(|(&g, &h)| page_move(Tier::Gpu, g, h))
        .collect();
    let contiguous = |from| -> Vec<PageMove> {
        (0..shape.gpu_pages)
            .map(|p| page_move(from, p, p))
            .collect()
    };
    let back: Vec<PageMove> = scattered
        .iter()
        .map(|m| page_move(Tier::Host, m.dst, m.src))
        .collect();

    let cases: [(&str, Tier, &[PageMove]); 4] = [
        ("offload GPU->host scattered ", Tier::Gpu, &scattered),
        (
            "offload GPU->host contiguous",
            Tier::Gpu,
            &contiguous(Tier::Gpu),
        ),
        ("reload  host->GPU scattered ", Tier::Host, &back),
        (
            "reload  host->GPU contiguous",
            Tier::Host,
            &contiguous(Tier::Host),
        ),
    ];
    let mut all_correct = true;
    for (name, from, moves) in cases {
        prepare(mem, from)?;
        let (best, mean) = time_moves(mem, from, moves, args.iters)?;
        let wrong = verify(mem, from.other(), moves)?;
        all_correct &= wrong == 0;
        let verdict = if wrong == 0 {
            "correct".to_string()
        } else {
            format!("WRONG ({wrong} pages)")
        };
        println!(
            "{name} ({:>5} copies): {verdict}, {:6.2} GB/s mean, {:6.2} GB/s best",
            page_runs(moves).count(),
            bytes / mean / 1e9,
            bytes / best / 1e9,
        );
    }
    Ok(all_correct)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("copy_bandwidth: {error}");
            return ExitCode::from(2);
        }
    };
    let shape = PoolShape::new(args.page_kib * 1024, args.pages, args.pages);
    let tables = BlockTableShape::new(0, 0);
    let result = if args.host {
        println!("backend: host memory (Vec<u8>)");
        HostKvStore::new(shape, tables).and_then(|mut mem| bench(&mut mem, &args))
    } else {
        let ctx = match open_device(0) {
            Ok(ctx) => ctx,
            Err(error) => {
                println!("copy_bandwidth: skipped: {error}");
                return ExitCode::SUCCESS;
            }
        };
        let name = ctx
            .name()
            .unwrap_or_else(|error| format!("<name unavailable: {error}>"));
        println!("backend: CUDA device 0 ({name}), pinned host tier (not write-combined)");
        CudaKvStore::new(&ctx, shape, tables).and_then(|mut mem| bench(&mut mem, &args))
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("copy_bandwidth: data mismatch");
            ExitCode::FAILURE
        }
        Err(error) => {
            println!("copy_bandwidth: error: {error}");
            ExitCode::FAILURE
        }
    }
}
