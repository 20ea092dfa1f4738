/*
 * A serving loop on kvsched's C ABI: submit, schedule, copy the page moves, run the batch (here: count
 * its tokens), complete the step, finish the requests that produced their output. Then the same
 * prompt served disaggregated: a prefill engine computes it and sends its KV to a decode engine. Then
 * an engine that publishes its KV events to a KV-aware router: it drains the log, names each stored
 * block by the keys it recomputes from its hashes, and encodes vLLM's batch for its ZMQ socket.
 *
 * Built and run by capi/tests/c_example.rs under AddressSanitizer and UndefinedBehaviorSanitizer:
 *   cc -std=c11 -Wall -Wextra -Werror -fsanitize=address,undefined -Icapi/include \
 *      examples/c/serve_loop.c target/debug/libkvsched_capi.a -lpthread -ldl -lm -o serve_loop
 * and by capi/tests/install.rs against the dynamic library, installed by capi/install.sh PREFIX:
 *   cc -std=c11 examples/c/serve_loop.c $(pkg-config --cflags --libs kvsched) -o serve_loop
 *   LD_LIBRARY_PATH=PREFIX/lib ./serve_loop    (the loader does not search PREFIX/lib by itself)
 * (capi/README.md: building, linking, installing.)
 */
#include <stdio.h>
#include <string.h>

#include "kvsched.h"

#define REQUESTS 24
#define CHECK(call)                                                                          \
    do {                                                                                     \
        kvsched_status s_ = (call);                                                          \
        if (s_ != KVSCHED_STATUS_OK) {                                                       \
            fprintf(stderr, "%s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call, (int)s_,     \
                    kvsched_last_error());                                                   \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)
#define EXPECT(cond)                                                                         \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);              \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

static kvsched_config small_config(void) {
    kvsched_config c = kvsched_config_default();
    c.tokens_per_block = 16;
    c.gpu_pages = 96;
    c.host_pages = 64;
    c.max_blocks_per_request = 32;
    c.max_requests = 32;
    c.max_num_tokens = 256;
    c.chunk_unit = 64;
    c.adapter_device_pages = 4;
    c.adapter_host_pages = 16;
    return c;
}

/* Output tokens each request produces (the last prompt chunk yields the first). */
static unsigned produced[REQUESTS];
static const unsigned out_len = 12;

static int serve(void) {
    kvsched_config c = small_config();
    kvsched_engine *e = NULL;
    CHECK(kvsched_engine_new(&c, &e));
    CHECK(kvsched_register_adapter(e, 100, 2));
    CHECK(kvsched_register_adapter(e, 101, 2));

    /* A shared 64-token system prompt (4 blocks), then each request's own blocks. */
    for (uint64_t i = 0; i < REQUESTS; i++) {
        uint64_t hashes[8];
        uint32_t prompt = 96 + (uint32_t)(i % 4) * 16;
        size_t n = prompt / c.tokens_per_block;
        for (size_t b = 0; b < n && b < 8; b++) hashes[b] = b < 4 ? 7000 + b : 1000 * (i + 1) + b;
        kvsched_request r;
        memset(&r, 0, sizeof r);
        r.id = i;
        r.prompt = prompt;
        r.max_new_tokens = out_len;
        r.has_lora = i % 3 != 0;
        r.lora_task = 100 + i % 2;
        CHECK(kvsched_submit(e, &r, hashes, n < 8 ? n : 8));
    }

    /* Bad input is refused with a code and a message, and changes nothing. */
    kvsched_request dup;
    memset(&dup, 0, sizeof dup);
    dup.id = 3;
    dup.prompt = 10;
    EXPECT(kvsched_submit(e, &dup, NULL, 0) == KVSCHED_STATUS_UNKNOWN_REQUEST);
    EXPECT(strlen(kvsched_last_error()) > 0);
    EXPECT(kvsched_len(e) == REQUESTS);
    EXPECT(kvsched_submit(NULL, &dup, NULL, 0) == KVSCHED_STATUS_NULL_POINTER);
    EXPECT(kvsched_finish(e, 999) == KVSCHED_STATUS_UNKNOWN_REQUEST);

    unsigned passes = 0, finished = 0, tokens = 0, moves = 0, loads = 0;
    while (kvsched_len(e) > 0 && passes < 10000) {
        kvsched_output out;
        CHECK(kvsched_schedule(e, &out));
        passes++;
        loads += (unsigned)out.n_adapter_loads;
        /* The copy engine runs the page moves before the step. */
        const kvsched_page_move *m = NULL;
        size_t nm = 0;
        CHECK(kvsched_take_moves(e, &m, &nm));
        moves += (unsigned)nm;
        /* Every batched request has its pages. */
        for (size_t k = 0; k < out.n_generation; k++) {
            const uint32_t *pages = NULL;
            size_t np = 0;
            CHECK(kvsched_page_table(e, out.generation[k].id, &pages, &np));
            EXPECT(np > 0 && pages != NULL);
        }
        /* "Run" the step: the last chunk and every decode step produce one token. */
        for (size_t k = 0; k < out.n_context; k++) {
            tokens += out.context[k].tokens;
            if (out.context[k].last) produced[out.context[k].id]++;
        }
        for (size_t k = 0; k < out.n_generation; k++) produced[out.generation[k].id]++;
        for (size_t k = 0; k < out.n_recompute_paused; k++) produced[out.recompute_paused[k].id] = 0;
        CHECK(kvsched_complete_step(e));
        EXPECT(kvsched_complete_step(e) == KVSCHED_STATUS_STALE_OUTPUT);
        for (size_t k = 0; k < out.n_generation; k++) {
            uint64_t id = out.generation[k].id;
            if (produced[id] >= out_len) {
                CHECK(kvsched_finish(e, id));
                finished++;
            }
        }
    }
    EXPECT(finished == REQUESTS);
    EXPECT(kvsched_gpu_free(e) <= c.gpu_pages);
    printf("served %u requests in %u passes: %u prompt tokens computed, %u page moves, %u adapter loads\n",
           finished, passes, tokens, moves, loads);
    kvsched_engine_free(e);
    return 0;
}

/* Disaggregated: the prefill engine computes the prompt and sends its KV; the decode engine prepares
 * the pages, receives it, and decodes. */
static int disaggregated(void) {
    kvsched_config c = small_config();
    kvsched_engine *p = NULL, *d = NULL;
    CHECK(kvsched_engine_new(&c, &p));
    CHECK(kvsched_engine_new(&c, &d));
    kvsched_request r;
    memset(&r, 0, sizeof r);
    r.id = 42;
    r.prompt = 100;
    r.max_new_tokens = 8;
    r.kind = 1; /* context-only */
    CHECK(kvsched_submit(p, &r, NULL, 0));
    unsigned free_before = kvsched_gpu_free(p);
    kvsched_output out;
    int computed = 0;
    for (int pass = 0; pass < 8 && !computed; pass++) {
        CHECK(kvsched_schedule(p, &out));
        for (size_t k = 0; k < out.n_context; k++) computed |= out.context[k].last;
        CHECK(kvsched_complete_step(p));
    }
    EXPECT(computed);
    /* Sending: its pages stay pinned, it is never scheduled again. */
    EXPECT(kvsched_gpu_free(p) < free_before);
    CHECK(kvsched_schedule(p, &out));
    EXPECT(out.n_context == 0 && out.n_generation == 0);
    CHECK(kvsched_complete_step(p));

    r.kind = 2; /* the decode side */
    CHECK(kvsched_submit(d, &r, NULL, 0));
    CHECK(kvsched_schedule(d, &out));
    EXPECT(out.n_disagg == 1 && out.disagg[0].id == 42);
    CHECK(kvsched_complete_step(d));
    EXPECT(kvsched_end_receive(d, 42, 1) == KVSCHED_STATUS_INVALID); /* not started */
    CHECK(kvsched_start_receive(d, 42));
    /* ... the transceiver moves the KV; both ends learn it arrived ... */
    CHECK(kvsched_end_receive(d, 42, 1));
    CHECK(kvsched_end_send(p, 42, 1));
    EXPECT(kvsched_gpu_free(p) == free_before && kvsched_len(p) == 0);
    EXPECT(kvsched_end_send(p, 42, 1) == KVSCHED_STATUS_UNKNOWN_REQUEST);
    CHECK(kvsched_schedule(d, &out));
    EXPECT(out.n_generation == 1 && out.generation[0].id == 42);
    CHECK(kvsched_complete_step(d));
    CHECK(kvsched_finish(d, 42));
    printf("disaggregated: request 42 prefilled on one engine, decoded on the other\n");
    kvsched_engine_free(p);
    kvsched_engine_free(d);
    return 0;
}

/* KV events: a 64-token prompt (4 blocks of 16) computed, its blocks stored; the engine knows their
 * keys (the request's root chained with its hashes) and their tokens, and encodes the vLLM batch. */
static int publish(void) {
    kvsched_config c = small_config();
    c.kv_events = 256;
    kvsched_engine *e = NULL;
    CHECK(kvsched_engine_new(&c, &e));
    uint64_t hashes[4] = {501, 502, 503, 504};
    uint32_t tokens[64];
    for (uint32_t t = 0; t < 64; t++) tokens[t] = 1000 + t;
    kvsched_request r;
    memset(&r, 0, sizeof r);
    r.id = 7;
    r.prompt = 64;
    r.max_new_tokens = 4;
    CHECK(kvsched_submit(e, &r, hashes, 4));
    uint64_t keys[4], root = 0;
    CHECK(kvsched_prefix_root(e, 7, &root));
    for (int b = 0; b < 4; b++) keys[b] = kvsched_chain(b == 0 ? root : keys[b - 1], hashes[b]);
    kvsched_output out;
    CHECK(kvsched_schedule(e, &out));
    EXPECT(out.n_context == 1 && out.context[0].last);
    CHECK(kvsched_complete_step(e));
    const kvsched_kv_event *ev = NULL;
    size_t n = 0;
    CHECK(kvsched_take_kv_events(e, &ev, &n));
    EXPECT(n == 4);
    kvsched_vllm_event wire[4];
    memset(wire, 0, sizeof wire);
    for (size_t k = 0; k < n; k++) {
        EXPECT(ev[k].kind == KVSCHED_KV_STORED && ev[k].host == 0 && ev[k].key == keys[k]);
        wire[k].kind = KVSCHED_KV_STORED;
        wire[k].block_hashes = &keys[k];
        wire[k].n_blocks = 1;
        wire[k].token_ids = &tokens[16 * k];
        wire[k].n_tokens = 16;
        wire[k].block_size = 16;
        /* A first block's parent is the root, which a router never saw: None on the wire. */
        wire[k].has_parent = ev[k].parent != root;
        wire[k].parent = ev[k].parent;
    }
    uint8_t buf[1024];
    size_t len = 0;
    CHECK(kvsched_encode_kv_events(wire, n, 1.0, 0, buf, sizeof buf, &len));
    EXPECT(len > 4 * 16 && buf[0] == 0x93); /* [ts, events, rank] */
    size_t needed = 0; /* a buffer too small: refused, with the size the batch takes */
    EXPECT(kvsched_encode_kv_events(wire, n, 1.0, 0, buf, 8, &needed) == KVSCHED_STATUS_CAPACITY);
    EXPECT(needed == len);
    CHECK(kvsched_finish(e, 7));
    printf("published 4 stored blocks in a %zu-byte vLLM batch\n", len);
    kvsched_engine_free(e);
    return 0;
}

int main(void) {
    kvsched_config bad = small_config();
    bad.max_requests = 0;
    kvsched_engine *e = (kvsched_engine *)&bad; /* must be overwritten with NULL */
    EXPECT(kvsched_engine_new(&bad, &e) == KVSCHED_STATUS_INVALID && e == NULL);
    if (serve() != 0) return 1;
    if (disaggregated() != 0) return 1;
    if (publish() != 0) return 1;
    return 0;
}
