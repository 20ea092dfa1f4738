//! Data-integrity tests, run on the host backend always and on the CUDA backend when a driver and
//! a device are present (otherwise they print "skipped: <reason>" and pass).
//!
//! Every check fills pages with patterns, moves them, overwrites the sources and compares every
//! byte of every page of both tiers against a model.

mod common;

use common::{cuda_or_skip, moves, pattern, Model};
use kvsched_gpu::{
    AdapterMemory, BlockTableShape, CopyMethod, CopyPlan, CudaAdapterStore, CudaKvStore,
    HostAdapterStore, HostKvStore, KvMemory, MemError, PageStore, PoolShape, Tier, BLOCK_TABLE_PAD,
};

/// Page size deliberately not a power of two, so wrong page math shows.
const KV_SHAPE: PoolShape = PoolShape::new(4100, 16, 12);
const TABLES: BlockTableShape = BlockTableShape::new(4, 6);
const ADAPTER_SHAPE: PoolShape = PoolShape::new(3000, 6, 10);

/// Offload scattered GPU pages, overwrite the GPU tier, reload into different GPU pages.
fn kv_round_trip<M: KvMemory>(mem: &mut M) {
    let mut model = Model::zeroed(mem);
    model.check(mem).unwrap();
    for page in 0..mem.shape().gpu_pages {
        model.write(mem, Tier::Gpu, page, 1000 + u64::from(page));
    }
    // 12, 13, 14 -> 5, 6, 7 is one run; the rest are single pages.
    let offload = moves(
        Tier::Gpu,
        &[(3, 11), (7, 2), (0, 4), (12, 5), (13, 6), (14, 7), (5, 0)],
    );
    mem.offload(&offload).unwrap().wait().unwrap();
    model.apply(&offload);
    model.check(mem).unwrap();

    for page in 0..mem.shape().gpu_pages {
        model.write(mem, Tier::Gpu, page, 2000 + u64::from(page));
    }
    model.check(mem).unwrap();

    let reload = moves(
        Tier::Host,
        &[(11, 15), (2, 1), (4, 2), (5, 3), (6, 9), (7, 10), (0, 8)],
    );
    let event = mem.reload(&reload).unwrap();
    event.wait().unwrap();
    assert!(event.is_complete().unwrap());
    model.apply(&reload);
    model.check(mem).unwrap();

    // Independent of the model: GPU page 15 went 3 -> host 11 -> 15.
    let mut out = vec![0; mem.shape().page_bytes];
    mem.read_page(Tier::Gpu, 15, &mut out).unwrap();
    assert_eq!(out, pattern(1003, mem.shape().page_bytes));
    mem.read_page(Tier::Gpu, 14, &mut out).unwrap();
    assert_eq!(out, pattern(2014, mem.shape().page_bytes));
}

/// Invalid move lists and buffers are refused and no page changes (the bad entry is last, so a
/// store that copied before validating would show it).
fn kv_bad_input_changes_nothing<M: KvMemory>(mem: &mut M) {
    let mut model = Model::zeroed(mem);
    for page in 0..KV_SHAPE.gpu_pages {
        model.write(mem, Tier::Gpu, page, 3000 + u64::from(page));
    }
    for page in 0..KV_SHAPE.host_pages {
        model.write(mem, Tier::Host, page, 4000 + u64::from(page));
    }
    let out_of_range = |tier, page, pages| Some(MemError::PageOutOfRange { tier, page, pages });
    assert_eq!(
        mem.offload(&moves(Tier::Gpu, &[(0, 0), (1, 1), (16, 2)]))
            .err(),
        out_of_range(Tier::Gpu, 16, 16)
    );
    assert_eq!(
        mem.offload(&moves(Tier::Gpu, &[(0, 0), (1, 12)])).err(),
        out_of_range(Tier::Host, 12, 12)
    );
    assert_eq!(
        mem.reload(&moves(Tier::Host, &[(0, 3), (12, 4)])).err(),
        out_of_range(Tier::Host, 12, 12)
    );
    assert_eq!(
        mem.reload(&moves(Tier::Host, &[(0, 3), (1, u32::MAX)]))
            .err(),
        out_of_range(Tier::Gpu, u32::MAX, 16)
    );
    assert_eq!(
        mem.reload(&moves(Tier::Host, &[(0, 3), (1, 4), (2, 3)]))
            .err(),
        Some(MemError::DuplicateTarget {
            tier: Tier::Gpu,
            page: 3
        })
    );
    assert_eq!(
        mem.offload(&moves(Tier::Gpu, &[(0, 9), (0, 9)])).err(),
        Some(MemError::DuplicateTarget {
            tier: Tier::Host,
            page: 9
        })
    );
    // A move from the other tier, last in the list: refused before anything is copied.
    let mut wrong = moves(Tier::Gpu, &[(0, 0), (1, 1)]);
    wrong.extend(moves(Tier::Host, &[(2, 2)]));
    assert_eq!(
        mem.offload(&wrong).err(),
        Some(MemError::WrongSourceTier {
            expected: Tier::Gpu,
            found: Tier::Host,
            page: 2
        })
    );
    let mut wrong = moves(Tier::Host, &[(0, 0), (1, 1)]);
    wrong.extend(moves(Tier::Gpu, &[(2, 2)]));
    assert_eq!(
        mem.reload(&wrong).err(),
        Some(MemError::WrongSourceTier {
            expected: Tier::Host,
            found: Tier::Gpu,
            page: 2
        })
    );
    let mut short = vec![0; KV_SHAPE.page_bytes - 1];
    let mismatch = Some(MemError::LengthMismatch {
        expected: KV_SHAPE.page_bytes,
        actual: short.len(),
    });
    assert_eq!(mem.read_page(Tier::Gpu, 0, &mut short).err(), mismatch);
    assert_eq!(mem.write_page(Tier::Host, 0, &short).err(), mismatch);
    let mut page = vec![0; KV_SHAPE.page_bytes];
    assert_eq!(
        mem.read_page(Tier::Host, 12, &mut page).err(),
        out_of_range(Tier::Host, 12, 12)
    );
    assert_eq!(
        mem.write_page(Tier::Gpu, 16, &page).err(),
        out_of_range(Tier::Gpu, 16, 16)
    );
    assert_eq!(
        mem.page_offset(Tier::Gpu, 16).err(),
        out_of_range(Tier::Gpu, 16, 16)
    );
    assert_eq!(mem.page_offset(Tier::Host, 3), Ok(3 * KV_SHAPE.page_bytes));
    // An empty list is a no-op; a failed list does not poison the next one.
    mem.offload(&[]).unwrap().wait().unwrap();
    mem.synchronize().unwrap();
    model.check(mem).unwrap();
    let ok = moves(Tier::Host, &[(0, 3), (1, 4), (2, 9)]);
    mem.reload(&ok).unwrap().wait().unwrap();
    model.apply(&ok);
    model.check(mem).unwrap();
}

/// Block tables: staged rows reach the device only on upload, padded with -1.
fn kv_block_tables<M: KvMemory>(mem: &mut M) {
    let shape = mem.block_table_shape();
    assert_eq!(shape, TABLES);
    let width = TABLES.width as usize;
    let mut expected = vec![BLOCK_TABLE_PAD; TABLES.entries()];
    let mut out = vec![0; TABLES.entries()];
    mem.read_block_tables(TABLES.rows, &mut out).unwrap();
    assert_eq!(out, expected, "fresh table is all padding");

    let rows: [&[u32]; 4] = [&[3, 1, 4], &[], &[15, 9, 2, 6, 5, 3], &[0]];
    for (row, pages) in rows.iter().enumerate() {
        mem.stage_block_table(row as u32, pages).unwrap();
    }
    mem.read_block_tables(TABLES.rows, &mut out).unwrap();
    assert_eq!(
        out, expected,
        "staged rows are not visible before the upload"
    );

    mem.upload_block_tables(3).unwrap().wait().unwrap();
    for (row, pages) in rows.iter().enumerate().take(3) {
        for (entry, &page) in expected[row * width..].iter_mut().zip(pages.iter()) {
            *entry = page as i32;
        }
    }
    mem.read_block_tables(TABLES.rows, &mut out).unwrap();
    assert_eq!(out, expected, "three rows uploaded, row 3 still padding");
    let mut three = vec![0; 3 * width];
    mem.read_block_tables(3, &mut three).unwrap();
    assert_eq!(three, expected[..3 * width]);

    mem.upload_block_tables(4).unwrap().wait().unwrap();
    expected[3 * width] = 0;
    mem.read_block_tables(TABLES.rows, &mut out).unwrap();
    assert_eq!(out, expected);

    // A shorter list for row 0 leaves no stale entries behind it.
    mem.stage_block_table(0, &[7]).unwrap();
    mem.upload_block_tables(1).unwrap().wait().unwrap();
    expected[..width].copy_from_slice(&[7, -1, -1, -1, -1, -1]);
    mem.read_block_tables(TABLES.rows, &mut out).unwrap();
    assert_eq!(out, expected);

    mem.upload_block_tables(0).unwrap().wait().unwrap();
    assert_eq!(
        mem.stage_block_table(4, &[1]),
        Err(MemError::RowOutOfRange { row: 4, rows: 4 })
    );
    assert_eq!(
        mem.stage_block_table(0, &[1; 7]),
        Err(MemError::RowTooLong { len: 7, width: 6 })
    );
    assert_eq!(
        mem.stage_block_table(0, &[1, 16]),
        Err(MemError::PageOutOfRange {
            tier: Tier::Gpu,
            page: 16,
            pages: 16
        })
    );
    assert_eq!(
        mem.upload_block_tables(5).err(),
        Some(MemError::RowOutOfRange { row: 5, rows: 4 })
    );
    assert_eq!(
        mem.read_block_tables(2, &mut out).err(),
        Some(MemError::LengthMismatch {
            expected: 2 * width,
            actual: out.len()
        })
    );
    mem.upload_block_tables(4).unwrap().wait().unwrap();
    mem.read_block_tables(TABLES.rows, &mut out).unwrap();
    assert_eq!(out, expected, "refused stages left the staging table alone");
}

/// Adapter weights in host pages reach device pages on upload; eviction reuses device pages.
fn adapter_uploads<M: AdapterMemory>(mem: &mut M) {
    let mut model = Model::zeroed(mem);
    for page in 0..ADAPTER_SHAPE.host_pages {
        model.write(mem, Tier::Host, page, 5000 + u64::from(page));
    }
    // Adapter A = host pages 0, 1, 2 into device pages 4, 0, 1.
    let adapter_a = moves(Tier::Host, &[(0, 4), (1, 0), (2, 1)]);
    mem.upload_adapter(&adapter_a).unwrap().wait().unwrap();
    model.apply(&adapter_a);
    model.check(mem).unwrap();
    // A is evicted (no copy); B = host pages 5, 3 reuses device pages 0, 1.
    let adapter_b = moves(Tier::Host, &[(5, 0), (3, 1)]);
    mem.upload_adapter(&adapter_b).unwrap().wait().unwrap();
    model.apply(&adapter_b);
    model.check(mem).unwrap();
    // One host page may feed two device pages.
    let fan_out = moves(Tier::Host, &[(9, 2), (9, 3)]);
    mem.upload_adapter(&fan_out).unwrap().wait().unwrap();
    model.apply(&fan_out);
    model.check(mem).unwrap();
    // Scribble over the device pages, then bring A back from its intact host copy.
    for page in 0..ADAPTER_SHAPE.gpu_pages {
        model.write(mem, Tier::Gpu, page, 6000 + u64::from(page));
    }
    let adapter_a_again = moves(Tier::Host, &[(0, 5), (1, 2), (2, 3)]);
    mem.upload_adapter(&adapter_a_again)
        .unwrap()
        .wait()
        .unwrap();
    model.apply(&adapter_a_again);
    model.check(mem).unwrap();
    assert_eq!(
        mem.upload_adapter(&moves(Tier::Host, &[(0, 1), (1, 1)]))
            .err(),
        Some(MemError::DuplicateTarget {
            tier: Tier::Gpu,
            page: 1
        })
    );
    assert_eq!(
        mem.upload_adapter(&moves(Tier::Gpu, &[(0, 1)])).err(),
        Some(MemError::WrongSourceTier {
            expected: Tier::Host,
            found: Tier::Gpu,
            page: 0
        })
    );
    assert_eq!(
        mem.upload_adapter(&moves(Tier::Host, &[(10, 1)])).err(),
        Some(MemError::PageOutOfRange {
            tier: Tier::Host,
            page: 10,
            pages: 10
        })
    );
    model.check(mem).unwrap();
}

/// A pool without a host tier: GPU pages work, every offload is refused.
fn kv_without_host_tier<M: KvMemory>(mem: &mut M) {
    let mut model = Model::zeroed(mem);
    assert!(model.host.is_empty());
    model.write(mem, Tier::Gpu, 3, 7000);
    assert_eq!(
        mem.offload(&moves(Tier::Gpu, &[(3, 0)])).err(),
        Some(MemError::PageOutOfRange {
            tier: Tier::Host,
            page: 0,
            pages: 0
        })
    );
    mem.offload(&[]).unwrap().wait().unwrap();
    model.check(mem).unwrap();
}

const NO_HOST: PoolShape = PoolShape::new(64, 4, 0);

#[test]
fn host_kv_round_trip() {
    kv_round_trip(&mut HostKvStore::new(KV_SHAPE, TABLES).unwrap());
}

#[test]
fn host_kv_round_trip_layer_major() {
    for layers in [2, 5, 32] {
        let shape = PoolShape::new(160 * layers as usize, 16, 12).with_layers(layers);
        kv_round_trip(&mut HostKvStore::new(shape, TABLES).unwrap());
    }
}

#[test]
fn host_kv_bad_input_changes_nothing() {
    kv_bad_input_changes_nothing(&mut HostKvStore::new(KV_SHAPE, TABLES).unwrap());
}

#[test]
fn host_kv_block_tables() {
    kv_block_tables(&mut HostKvStore::new(KV_SHAPE, TABLES).unwrap());
}

#[test]
fn host_adapter_uploads() {
    adapter_uploads(&mut HostAdapterStore::new(ADAPTER_SHAPE).unwrap());
}

#[test]
fn host_kv_without_host_tier() {
    kv_without_host_tier(&mut HostKvStore::new(NO_HOST, BlockTableShape::new(0, 0)).unwrap());
}

#[test]
fn host_tier_memory_is_the_page_math() {
    let mut mem = HostKvStore::new(KV_SHAPE, TABLES).unwrap();
    let bytes = pattern(42, KV_SHAPE.page_bytes);
    mem.write_page(Tier::Host, 5, &bytes).unwrap();
    let offset = mem.page_offset(Tier::Host, 5).unwrap();
    assert_eq!(
        &mem.tier_memory(Tier::Host)[offset..offset + KV_SHAPE.page_bytes],
        &bytes[..]
    );
}

#[test]
fn invalid_shapes_are_errors() {
    let zero = PoolShape::new(0, 1, 1);
    assert!(matches!(
        HostKvStore::new(zero, TABLES),
        Err(MemError::InvalidShape { .. })
    ));
    assert!(matches!(
        HostAdapterStore::new(zero),
        Err(MemError::InvalidShape { .. })
    ));
    let huge = PoolShape::new(usize::MAX / 4, 8, 0);
    assert!(matches!(
        HostKvStore::new(huge, TABLES),
        Err(MemError::InvalidShape { .. })
    ));
    let tables = BlockTableShape::new(u32::MAX, u32::MAX);
    assert!(matches!(
        HostKvStore::new(KV_SHAPE, tables),
        Err(MemError::InvalidShape { .. })
    ));
}

#[test]
fn cuda_kv_round_trip() {
    let Some(ctx) = cuda_or_skip("cuda_kv_round_trip") else {
        return;
    };
    kv_round_trip(&mut CudaKvStore::new(&ctx, KV_SHAPE, TABLES).unwrap());
}

#[test]
fn cuda_kv_bad_input_changes_nothing() {
    let Some(ctx) = cuda_or_skip("cuda_kv_bad_input_changes_nothing") else {
        return;
    };
    kv_bad_input_changes_nothing(&mut CudaKvStore::new(&ctx, KV_SHAPE, TABLES).unwrap());
}

#[test]
fn cuda_kv_block_tables() {
    let Some(ctx) = cuda_or_skip("cuda_kv_block_tables") else {
        return;
    };
    kv_block_tables(&mut CudaKvStore::new(&ctx, KV_SHAPE, TABLES).unwrap());
}

#[test]
fn cuda_adapter_uploads() {
    let Some(ctx) = cuda_or_skip("cuda_adapter_uploads") else {
        return;
    };
    adapter_uploads(&mut CudaAdapterStore::new(&ctx, ADAPTER_SHAPE).unwrap());
}

#[test]
fn cuda_kv_without_host_tier() {
    let Some(ctx) = cuda_or_skip("cuda_kv_without_host_tier") else {
        return;
    };
    kv_without_host_tier(&mut CudaKvStore::new(&ctx, NO_HOST, BlockTableShape::new(0, 0)).unwrap());
}

/// Every copy method moves exactly the bytes the moves name, for a page size the kernel takes
/// (4 KiB), one it cannot (4100 bytes: not a multiple of 16, so it falls back), one it cuts into
/// 64 KiB pieces (192 KiB), and layer-major pages (32 pieces each); the store says what it ran.
#[test]
fn cuda_every_copy_method_is_byte_exact() {
    let Some(ctx) = cuda_or_skip("cuda_every_copy_method_is_byte_exact") else {
        return;
    };
    let methods = [
        CopyMethod::PerRun,
        CopyMethod::Batched,
        CopyMethod::Kernel { blocks: 1 },
        CopyMethod::Kernel { blocks: 4 },
        CopyMethod::AUTO,
    ];
    let shapes = [
        PoolShape::new(4096, 16, 12),
        PoolShape::new(4100, 16, 12),
        PoolShape::new(192 << 10, 16, 12),
        // Layer-major: 32 layers of 2 KiB (an 8B model's per-layer K and V of a 8-token block).
        PoolShape::new(64 << 10, 16, 12).with_layers(32),
    ];
    for shape in shapes {
        for method in methods {
            let mut mem = CudaKvStore::new(&ctx, shape, TABLES).unwrap();
            mem.set_copy_method(method);
            let plan = mem.copy_plan();
            println!("{shape:?}, {method:?}: runs {plan:?}");
            if shape.piece_bytes() % 16 != 0 {
                assert!(!matches!(plan, CopyPlan::Kernel { .. }), "{plan:?}");
            }
            if matches!(method, CopyMethod::Kernel { .. }) && shape.piece_bytes() % 16 == 0 {
                assert!(
                    matches!(plan, CopyPlan::Kernel { .. }),
                    "the kernel loads on a device: {plan:?}"
                );
            }
            kv_round_trip(&mut mem);
        }
    }
}

/// Device addresses follow `base + page * page_bytes`, and the copy event can order another
/// stream (as a compute stream would) after a reload.
#[test]
fn cuda_page_addresses_and_stream_ordering() {
    let Some(ctx) = cuda_or_skip("cuda_page_addresses_and_stream_ordering") else {
        return;
    };
    let mut mem = CudaKvStore::new(&ctx, KV_SHAPE, TABLES).unwrap();
    let base = mem.page_address(0).unwrap();
    for page in 0..KV_SHAPE.gpu_pages {
        let offset = (page as usize * KV_SHAPE.page_bytes) as u64;
        assert_eq!(mem.page_address(page).unwrap(), base + offset);
    }
    assert!(mem.page_address(KV_SHAPE.gpu_pages).is_err());
    assert_eq!(mem.gpu_pages().len(), KV_SHAPE.tier_bytes(Tier::Gpu));
    assert_eq!(mem.device_block_tables().len(), TABLES.entries());

    let mut model = Model::zeroed(&mem);
    model.write(&mut mem, Tier::Host, 1, 8000);
    let reload = moves(Tier::Host, &[(1, 6)]);
    let event = mem.reload(&reload).unwrap();
    let compute = ctx.new_stream().unwrap();
    compute
        .wait(event.cuda_event().expect("a CUDA copy records an event"))
        .unwrap();
    let copied = compute
        .clone_dtoh(
            &mem.gpu_pages()
                .slice(6 * KV_SHAPE.page_bytes..7 * KV_SHAPE.page_bytes),
        )
        .unwrap();
    assert_eq!(copied, pattern(8000, KV_SHAPE.page_bytes));
    model.apply(&reload);
    model.check(&mem).unwrap();
}

/// Without a driver library, opening a device is the typed `NoDriver` error, not a panic.
#[test]
fn no_driver_is_a_typed_error() {
    let result = kvsched_gpu::open_device(0);
    if kvsched_gpu::driver_present() {
        println!("no_driver_is_a_typed_error: not applicable, a CUDA driver is present");
        return;
    }
    assert!(matches!(result, Err(MemError::NoDriver)));
    assert_eq!(
        MemError::NoDriver.to_string(),
        "no CUDA driver: libcuda could not be loaded"
    );
}
