; kvsched-gpu's gather/scatter page-copy kernel, in LLVM IR for the NVPTX back end.
; `scripts/gen-ptx.sh` compiles it to copy_pages.ptx (checked in; the crate embeds the PTX and the driver
; JIT-compiles it for the device at load time, so nothing is compiled at run time by the crate).
;
; kvsched_copy_pieces(descs, n): `descs` holds n copy pieces of three 64-bit words each: source address,
; target address, length in bytes (addresses in the device's unified address space: device memory or
; mapped pinned host memory; addresses and lengths multiples of 16). One warp copies one piece at a
; time, its 32 lanes striding the piece with 16-byte loads and stores (four in flight per lane); warps
; stride the pieces. A handful of blocks of 1024 threads hold the PCIe link (page-copy-methods.md).
target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()

define void @kvsched_copy_pieces(i64* %descs, i64 %n) {
entry:
  %tid32 = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %ctaid32 = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %ntid32 = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %nctaid32 = call i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()
  %tid = zext i32 %tid32 to i64
  %ctaid = zext i32 %ctaid32 to i64
  %ntid = zext i32 %ntid32 to i64
  %nctaid = zext i32 %nctaid32 to i64
  %lane = and i64 %tid, 31
  %block_first = mul i64 %ctaid, %ntid
  %thread = add i64 %block_first, %tid
  %warp = lshr i64 %thread, 5
  %threads = mul i64 %nctaid, %ntid
  %warps = lshr i64 %threads, 5
  %lane_off = shl i64 %lane, 4
  br label %piece

piece:
  %d = phi i64 [ %warp, %entry ], [ %d_next, %piece_done ]
  %more = icmp ult i64 %d, %n
  br i1 %more, label %load_desc, label %exit

load_desc:
  %slot = mul i64 %d, 3
  %p_src = getelementptr inbounds i64, i64* %descs, i64 %slot
  %slot1 = add i64 %slot, 1
  %p_dst = getelementptr inbounds i64, i64* %descs, i64 %slot1
  %slot2 = add i64 %slot, 2
  %p_len = getelementptr inbounds i64, i64* %descs, i64 %slot2
  %src = load i64, i64* %p_src, align 8
  %dst = load i64, i64* %p_dst, align 8
  %len = load i64, i64* %p_len, align 8
  br label %chunk

chunk:
  ; Four 16-byte loads in flight per lane (2 KiB a warp step) while the piece has room for them.
  %off = phi i64 [ %lane_off, %load_desc ], [ %off_next4, %copy4 ]
  %last4 = add i64 %off, 1536
  %in4 = icmp ult i64 %last4, %len
  br i1 %in4, label %copy4, label %tail

copy4:
  %off1 = add i64 %off, 512
  %off2 = add i64 %off, 1024
  %sa0 = add i64 %src, %off
  %sa1 = add i64 %src, %off1
  %sa2 = add i64 %src, %off2
  %sa3 = add i64 %src, %last4
  %sp0 = inttoptr i64 %sa0 to <4 x i32>*
  %sp1 = inttoptr i64 %sa1 to <4 x i32>*
  %sp2 = inttoptr i64 %sa2 to <4 x i32>*
  %sp3 = inttoptr i64 %sa3 to <4 x i32>*
  %v0 = load <4 x i32>, <4 x i32>* %sp0, align 16
  %v1 = load <4 x i32>, <4 x i32>* %sp1, align 16
  %v2 = load <4 x i32>, <4 x i32>* %sp2, align 16
  %v3 = load <4 x i32>, <4 x i32>* %sp3, align 16
  %da0 = add i64 %dst, %off
  %da1 = add i64 %dst, %off1
  %da2 = add i64 %dst, %off2
  %da3 = add i64 %dst, %last4
  %dp0 = inttoptr i64 %da0 to <4 x i32>*
  %dp1 = inttoptr i64 %da1 to <4 x i32>*
  %dp2 = inttoptr i64 %da2 to <4 x i32>*
  %dp3 = inttoptr i64 %da3 to <4 x i32>*
  store <4 x i32> %v0, <4 x i32>* %dp0, align 16
  store <4 x i32> %v1, <4 x i32>* %dp1, align 16
  store <4 x i32> %v2, <4 x i32>* %dp2, align 16
  store <4 x i32> %v3, <4 x i32>* %dp3, align 16
  %off_next4 = add i64 %off, 2048
  br label %chunk

tail:
  %toff = phi i64 [ %off, %chunk ], [ %toff_next, %copy1 ]
  %in1 = icmp ult i64 %toff, %len
  br i1 %in1, label %copy1, label %piece_done

copy1:
  %sa = add i64 %src, %toff
  %da = add i64 %dst, %toff
  %sp = inttoptr i64 %sa to <4 x i32>*
  %dp = inttoptr i64 %da to <4 x i32>*
  %v = load <4 x i32>, <4 x i32>* %sp, align 16
  store <4 x i32> %v, <4 x i32>* %dp, align 16
  %toff_next = add i64 %toff, 512
  br label %tail

piece_done:
  %d_next = add i64 %d, %warps
  br label %piece

exit:
  ret void
}

!nvvm.annotations = !{!0}
!0 = !{void (i64*, i64)* @kvsched_copy_pieces, !"kernel", i32 1}
