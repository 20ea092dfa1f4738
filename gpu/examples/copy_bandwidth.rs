//! Copy bandwidth of page moves: GPU→host (offload) and host→GPU (reload) with scattered page
//! lists, next to one contiguous copy of the same bytes (the physical reference), with a byte-exact
//! correctness check of every move.
//!
//! ```text
//! cargo run --release -p kvsched-gpu --example copy_bandwidth -- [--pages N] [--page-kib K] [--iters I] [--host]
//! cargo run --release -p kvsched-gpu --example copy_bandwidth -- --sweep [--mib M] [--iters I]
//! ```
//!
//! Defaults: 4096 pages of 64 KiB (256 MiB per move), 5 timed iterations after one warm-up, the
//! store's default copy method (`CopyMethod::AUTO`, the plan it resolved to is printed).
//! `--host` runs the host-memory backend instead (no GPU needed).
//!
//! `--sweep` (CUDA) moves M MiB (default 256) of shuffled pages of 4 KiB to 2 MiB both ways with every
//! copy method (one copy per run, the batched driver copy, the kernel on 1, 2 and 4 blocks, and the
//! default plan) next to one contiguous copy of the same bytes, and prints a Markdown table of GB/s
//! with each method's share of the contiguous copy. Every timed move is checked: the targets of every
//! 64th move are zeroed before a method runs and compared byte for byte after it.
//!
//! Without a CUDA driver it prints the reason and exits 0; a wrong byte exits 1.

use std::process::ExitCode;
use std::time::Instant;

use std::sync::Arc;

use kvsched_gpu::{
    open_device, page_runs, BlockTableShape, CopyMethod, CudaContext, CudaKvStore, HostKvStore,
    KvMemory, MemError, PageMove, PageStore, PoolShape, Tier,
};

/// A move of page `src` of tier `from` to page `dst` of the other tier (no request: a benchmark).
fn page_move(from: Tier, src: u32, dst: u32) -> PageMove {
    PageMove {
        request: kvsched_core::ids::RequestId::default(),
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
    sweep: bool,
    mib: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        pages: 4096,
        page_kib: 64,
        iters: 5,
        host: false,
        sweep: false,
        mib: 256,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--pages" => args.pages = value()?.parse().map_err(|e| format!("--pages: {e}"))?,
            "--page-kib" => {
                args.page_kib = value()?.parse().map_err(|e| format!("--page-kib: {e}"))?;
            }
            "--iters" => args.iters = value()?.parse().map_err(|e| format!("--iters: {e}"))?,
            "--host" => args.host = true,
            "--sweep" => args.sweep = true,
            "--mib" => args.mib = value()?.parse().map_err(|e| format!("--mib: {e}"))?,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if args.pages == 0 || args.page_kib == 0 || args.iters == 0 || args.mib < 2 {
        return Err("--pages, --page-kib and --iters must be positive, --mib at least 2".into());
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

/// Zeroes the targets of every `stride`-th move in `tier`, so a method that copies nothing fails.
fn zero_sample<M: KvMemory>(
    mem: &mut M,
    tier: Tier,
    moves: &[PageMove],
    stride: usize,
) -> Result<(), MemError> {
    let zeros = vec![0; mem.shape().page_bytes];
    for page_move in moves.iter().step_by(stride) {
        mem.write_page(tier, page_move.dst, &zeros)?;
    }
    Ok(())
}

/// Pages of the every-`stride`-th moves whose target does not hold its source's pattern.
fn verify_sample<M: KvMemory>(
    mem: &M,
    tier: Tier,
    moves: &[PageMove],
    stride: usize,
) -> Result<usize, MemError> {
    let sample: Vec<PageMove> = moves.iter().step_by(stride).copied().collect();
    verify(mem, tier, &sample)
}

/// GB/s of the mean of `iters` timed moves, after checking the moves land (see `zero_sample`).
fn measure(
    mem: &mut CudaKvStore,
    method: CopyMethod,
    from: Tier,
    moves: &[PageMove],
    iters: u32,
    correct: &mut bool,
) -> Result<f64, MemError> {
    mem.set_copy_method(method);
    zero_sample(mem, from.other(), moves, 64)?;
    let (_, mean) = time_moves(mem, from, moves, iters)?;
    let wrong = verify_sample(mem, from.other(), moves, 64)?;
    if wrong > 0 {
        println!("WRONG: {method:?} {from:?}: {wrong} sampled pages differ");
        *correct = false;
    }
    let bytes = (moves.len() * mem.shape().page_bytes) as f64;
    Ok(bytes / mean / 1e9)
}

/// The table of every method at every page size (see the module docs).
fn sweep(ctx: &Arc<CudaContext>, args: &Args) -> Result<bool, MemError> {
    let methods = [
        ("one copy per run", CopyMethod::PerRun),
        ("batched copy", CopyMethod::Batched),
        ("kernel, 1 block", CopyMethod::Kernel { blocks: 1 }),
        ("kernel, 2 blocks", CopyMethod::Kernel { blocks: 2 }),
        ("kernel, 4 blocks", CopyMethod::Kernel { blocks: 4 }),
        ("default plan", CopyMethod::AUTO),
    ];
    println!(
        "{} MiB of shuffled pages per move, mean of {} timed moves after 1 warm-up; GB/s (share of one contiguous copy)\n",
        args.mib, args.iters
    );
    let header: Vec<&str> = methods.iter().map(|(name, _)| *name).collect();
    println!("| page | direction | {} | contiguous |", header.join(" | "));
    println!("|---|---|{}---|", "---|".repeat(methods.len()));
    let mut correct = true;
    for kib in [4usize, 16, 64, 128, 256, 2048] {
        let pages = (args.mib * 1024 / kib) as u32;
        let shape = PoolShape::new(kib * 1024, pages, pages);
        let mut mem = CudaKvStore::new(ctx, shape, BlockTableShape::new(0, 0))?;
        let gpu_order = permutation(pages, 1);
        let host_order = permutation(pages, 2);
        let offload: Vec<PageMove> = gpu_order
            .iter()
            .zip(&host_order)
            .map(|(&g, &h)| page_move(Tier::Gpu, g, h))
            .collect();
        let reload: Vec<PageMove> = offload
            .iter()
            .map(|m| page_move(Tier::Host, m.dst, m.src))
            .collect();
        for (direction, from, moves) in [
            ("gpu to host", Tier::Gpu, &offload),
            ("host to gpu", Tier::Host, &reload),
        ] {
            prepare(&mut mem, from)?;
            let contiguous: Vec<PageMove> = (0..pages).map(|p| page_move(from, p, p)).collect();
            let whole = measure(
                &mut mem,
                CopyMethod::PerRun,
                from,
                &contiguous,
                args.iters,
                &mut correct,
            )?;
            let mut cells = Vec::new();
            for (_, method) in methods {
                let plan = {
                    mem.set_copy_method(method);
                    mem.copy_plan()
                };
                let gbps = measure(&mut mem, method, from, moves, args.iters, &mut correct)?;
                let cell = format!("{gbps:.1} ({:.0}%)", 100.0 * gbps / whole);
                cells.push(if method == CopyMethod::AUTO {
                    format!("{cell}: {plan:?}")
                } else {
                    cell
                });
            }
            let page = if kib >= 1024 {
                format!("{} MiB", kib / 1024)
            } else {
                format!("{kib} KiB")
            };
            println!(
                "| {page} | {direction} | {} | {whole:.1} |",
                cells.join(" | ")
            );
        }
    }
    Ok(correct)
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
        println!("backend: CUDA device 0 ({name}), pinned host tier (not write-combined, mapped)");
        if args.sweep {
            sweep(&ctx, &args)
        } else {
            CudaKvStore::new(&ctx, shape, tables).and_then(|mut mem| {
                println!("copy plan: {:?}", mem.copy_plan());
                bench(&mut mem, &args)
            })
        }
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
