//! The paged step: a packed batch of prefill chunks and decode tokens, whose attention reads each
//! sequence's past from the pages of its table in a [`HostKvStore`] and whose new keys and values
//! are written into those pages.

use std::collections::HashMap;

use kvsched_gpu::{HostKvStore, PageStore, Tier};

use crate::error::{EngineError, Result};
use crate::kv::{gather, scatter, KvLayout};
use crate::lora::Lora;
use crate::model::{Context, Model, Span, StepKv};

/// One sequence's part of a step: a prefill chunk (several tokens) or a decode token.
#[derive(Clone, Copy, Debug)]
pub struct Sequence<'a> {
    /// The tokens to run, at positions `start..start + tokens.len()` (at least one).
    pub tokens: &'a [u32],
    /// The position of the first token: the positions before it are in the pages already.
    pub start: usize,
    /// The sequence's page table: GPU page ids of the KV store, position `p` in entry
    /// `p / tokens_per_block`. It must cover `start + tokens.len()` positions; entries past that
    /// are not looked at.
    pub pages: &'a [u32],
    /// The page table of the model's local (sliding-window) layers, when they have one of their
    /// own: those layers' keys and values are then read from and written to these pages (their
    /// pieces of them), the global layers' to `pages`. `None`: every layer uses `pages`.
    ///
    /// Entries wholly before the window of the chunk's first token (entry `i` when
    /// `(i + 1) * tokens_per_block <= start + 1 - sliding_window`) are never read or checked: a
    /// freed page's entry may hold anything, e.g. [`Sequence::RELEASED`]. The same holds for the
    /// local layers' pieces of `pages` when this is `None`: a local layer reads no page that
    /// holds only positions before its window.
    pub local_pages: Option<&'a [u32]>,
    /// Whether the step returns the logits of the chunk's last token.
    pub logits: bool,
    /// The sequence's LoRA adapter: the GPU (device) pages of the adapter store that hold its
    /// weights, in weight order ([`crate::Lora`]'s format); `None` for the base model.
    pub adapter: Option<&'a [u32]>,
}

impl Sequence<'_> {
    /// A page table entry whose page was released (it is never read): what a local table holds
    /// for blocks wholly before the window.
    pub const RELEASED: u32 = kvsched_core::page_pool::NO_PAGE;
}

/// The sequences of one step, in row order.
#[derive(Clone, Debug, Default)]
pub struct Batch<'a> {
    /// The sequences.
    pub sequences: Vec<Sequence<'a>>,
}

impl<'a> Batch<'a> {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sequence.
    pub fn push(&mut self, sequence: Sequence<'a>) -> &mut Self {
        self.sequences.push(sequence);
        self
    }

    /// Rows (tokens) in the batch.
    pub fn rows(&self) -> usize {
        self.sequences.iter().map(|s| s.tokens.len()).sum()
    }
}

/// The logits a step returned: vocabulary-wide rows for each sequence that asked (its last token's
/// with [`Model::step`]; its last few tokens' with [`Model::step_with_logits`]).
#[derive(Clone, Debug)]
pub struct Logits {
    vocab: usize,
    data: Vec<f32>,
    /// Per sequence: its first row and its number of rows.
    spans: Vec<(usize, usize)>,
}

impl Logits {
    /// The logits of sequence `index`'s last token (`None` when it did not ask for them).
    pub fn get(&self, index: usize) -> Option<&[f32]> {
        let &(_, n) = self.spans.get(index)?;
        n.checked_sub(1).and_then(|last| self.row(index, last))
    }

    /// Rows sequence `index` asked for (0 for none, or an index outside the batch).
    pub fn count(&self, index: usize) -> usize {
        self.spans.get(index).map_or(0, |s| s.1)
    }

    /// Row `j` of sequence `index`: the logits of its `count - j`-th last token (`None` past
    /// [`Logits::count`]).
    pub fn row(&self, index: usize, j: usize) -> Option<&[f32]> {
        let &(first, n) = self.spans.get(index)?;
        (j < n).then(|| &self.data[(first + j) * self.vocab..(first + j + 1) * self.vocab])
    }

    /// The greedy token of sequence `index`.
    pub fn argmax(&self, index: usize) -> Option<u32> {
        self.get(index).map(crate::math::argmax)
    }

    /// Vocabulary width of a row.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

/// Where one layer's keys and values lie: its store (0; 1 for the local layers of a grouped step),
/// its piece of that store's pages, and whether it reads a sequence's local table when it has one.
#[derive(Clone, Copy, Debug)]
struct Place {
    store: usize,
    piece: usize,
    local: bool,
}

/// The KV stores of a step on a hybrid model's KV groups ([`Model::step_grouped`]): the global
/// (full-attention) layers' keys and values in `global`'s pages, one piece per global layer in
/// layer order, the local (sliding-window) layers' in `local`'s. Each sequence's `pages` name
/// `global`'s pages, its `local_pages` (required) `local`'s.
#[derive(Debug)]
pub struct GroupedKv<'a> {
    /// The store of the global layers (KV group 0).
    pub global: &'a mut HostKvStore,
    /// The store of the sliding-window layers (KV group 1).
    pub local: &'a mut HostKvStore,
}

/// The paged context: past keys and values gathered from the pages, the step's own appended.
struct Paged<'s> {
    stores: Vec<&'s HostKvStore>,
    layouts: Vec<KvLayout>,
    batch: &'s Batch<'s>,
    places: &'s [Place],
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Context for Paged<'_> {
    fn context(
        &mut self,
        span: usize,
        layer: usize,
        from: usize,
        new_k: &[f32],
        new_v: &[f32],
    ) -> Result<(usize, &[f32], &[f32])> {
        let s = &self.batch.sequences[span];
        let place = self.places[layer];
        let table = match (s.local_pages, place.local) {
            (Some(local), true) => local,
            _ => s.pages,
        };
        let layout = &self.layouts[place.store];
        self.k.clear();
        self.v.clear();
        let first = from / layout.tokens_per_block;
        gather(
            self.stores[place.store],
            layout,
            table,
            place.piece,
            (first, s.start),
            &mut self.k,
            &mut self.v,
        )?;
        self.k.extend_from_slice(new_k);
        self.v.extend_from_slice(new_v);
        Ok((first * layout.tokens_per_block, &self.k, &self.v))
    }
}

fn refuse<T>(why: String) -> Result<T> {
    Err(EngineError::Batch(why))
}

/// One logit count per sequence, none above its token count.
fn check_last(batch: &Batch<'_>, last: &[usize]) -> Result<()> {
    if last.len() != batch.sequences.len() {
        return refuse(format!(
            "{} logit counts for {} sequences",
            last.len(),
            batch.sequences.len()
        ));
    }
    if let Some(i) = (0..last.len()).find(|&i| last[i] > batch.sequences[i].tokens.len()) {
        return refuse(format!(
            "sequence {i}: {} logit rows of {} tokens",
            last[i],
            batch.sequences[i].tokens.len()
        ));
    }
    Ok(())
}

impl Model {
    /// Runs one step over `batch`: the projections and MLP over all rows at once, rope at each
    /// row's position, and attention of each row over its sequence's positions, reading the past
    /// from the pages of its table in the GPU tier of `kv` (summing in position order, so the
    /// result does not depend on how the sequence was chunked or batched). The new keys and values
    /// are written into the pages at their positions. Adapters are read from `adapters`' GPU tier.
    ///
    /// The batch is checked first, and refused whole (nothing computed, nothing written): an empty
    /// batch or sequence, a token outside the vocabulary, positions past the context length, a
    /// page table too short or with a page out of range or repeated, a page written by one
    /// sequence and in another's table, an adapter without an adapter store, a store whose shape
    /// does not fit the model.
    pub fn step(
        &self,
        batch: &Batch<'_>,
        kv: &mut HostKvStore,
        adapters: Option<&dyn PageStore>,
    ) -> Result<Logits> {
        let last: Vec<usize> = batch
            .sequences
            .iter()
            .map(|s| usize::from(s.logits))
            .collect();
        self.step_with_logits(batch, kv, adapters, &last)
    }

    /// [`Model::step`], returning the logits of the last `last[i]` tokens of sequence `i` (0: none;
    /// each sequence's `logits` flag is not looked at): what verifying draft tokens needs, the
    /// logits after every draft position. Refused as [`Model::step`], and when `last` does not have
    /// one entry per sequence or asks for more rows than a sequence has tokens.
    pub fn step_with_logits(
        &self,
        batch: &Batch<'_>,
        kv: &mut HostKvStore,
        adapters: Option<&dyn PageStore>,
        last: &[usize],
    ) -> Result<Logits> {
        let places: Vec<Place> = (0..self.config().blocks)
            .map(|l| Place {
                store: 0,
                piece: l,
                local: self.config().window(l).is_some(),
            })
            .collect();
        self.step_in(batch, &mut [kv], &places, adapters, last)
    }

    /// [`Model::step_with_logits`] on a hybrid model's KV groups: the global layers' keys and
    /// values read from and written to `kv.global`'s pages through each sequence's `pages`, the
    /// sliding-window layers' to `kv.local`'s through its `local_pages` (entries before the window
    /// of the chunk's first token are never read: [`Sequence::RELEASED`] there). Refused as
    /// [`Model::step_with_logits`], and for a model without sliding-window layers, a sequence
    /// without a local table, stores whose pieces are not the groups' layers or whose pages hold
    /// different numbers of positions.
    pub fn step_grouped(
        &self,
        batch: &Batch<'_>,
        kv: GroupedKv<'_>,
        adapters: Option<&dyn PageStore>,
        last: &[usize],
    ) -> Result<Logits> {
        let c = self.config();
        if (0..c.blocks).all(|l| c.window(l).is_none()) {
            return refuse("a grouped step needs a model with sliding-window layers".into());
        }
        if let Some(i) = batch.sequences.iter().position(|s| s.local_pages.is_none()) {
            return refuse(format!(
                "sequence {i} has no local page table (a grouped step reads the local layers' KV from \
                 a store of its own)"
            ));
        }
        let mut counts = [0; 2];
        let places: Vec<Place> = (0..c.blocks)
            .map(|l| {
                let store = usize::from(c.window(l).is_some());
                counts[store] += 1;
                Place {
                    store,
                    piece: counts[store] - 1,
                    local: store == 1,
                }
            })
            .collect();
        let GroupedKv { global, local } = kv;
        self.step_in(batch, &mut [global, local], &places, adapters, last)
    }

    /// The step over `stores`, each layer's KV where `places` says.
    fn step_in(
        &self,
        batch: &Batch<'_>,
        stores: &mut [&mut HostKvStore],
        places: &[Place],
        adapters: Option<&dyn PageStore>,
        last: &[usize],
    ) -> Result<Logits> {
        let layouts = store_layouts(self.config(), stores, places)?;
        let gpu: Vec<u32> = stores.iter().map(|s| s.shape().gpu_pages).collect();
        self.check(batch, (&layouts, &gpu, places), adapters)?;
        check_last(batch, last)?;
        let mut tokens = Vec::with_capacity(batch.rows());
        let mut spans = Vec::with_capacity(batch.sequences.len());
        let mut loras: Vec<Lora> = Vec::new();
        let mut lora_of: HashMap<&[u32], usize> = HashMap::new();
        let mut rows = vec![(0, 0); batch.sequences.len()];
        let mut logit_rows = Vec::new();
        let mut buf = Vec::new();
        for (i, s) in batch.sequences.iter().enumerate() {
            let adapter = match (s.adapter, adapters) {
                (Some(pages), Some(store)) => Some(if let Some(&a) = lora_of.get(pages) {
                    a
                } else {
                    let lora = Lora::read_pages(self.config(), store, Tier::Gpu, pages, &mut buf)?;
                    loras.push(lora);
                    lora_of.insert(pages, loras.len() - 1);
                    loras.len() - 1
                }),
                _ => None,
            };
            spans.push(Span {
                start: s.start,
                row0: tokens.len(),
                len: s.tokens.len(),
                adapter,
            });
            tokens.extend_from_slice(s.tokens);
            rows[i] = (logit_rows.len(), last[i]);
            logit_rows.extend(tokens.len() - last[i]..tokens.len());
        }
        let mut ctx = Paged {
            stores: stores.iter().map(|s| &**s).collect(),
            layouts: layouts.clone(),
            batch,
            places,
            k: Vec::new(),
            v: Vec::new(),
        };
        let (data, step) = self.forward(&tokens, &spans, &loras, &mut ctx, &logit_rows)?;
        write_kv(stores, &layouts, (batch, &spans), &step, places, &mut buf)?;
        Ok(Logits {
            vocab: self.config().vocab,
            data,
            spans: rows,
        })
    }

    fn check(
        &self,
        batch: &Batch<'_>,
        stores: (&[KvLayout], &[u32], &[Place]),
        adapters: Option<&dyn PageStore>,
    ) -> Result<()> {
        let c = self.config();
        if batch.sequences.is_empty() {
            return refuse("no sequences".into());
        }
        let mut entries = Vec::with_capacity(batch.sequences.len());
        let mut written: HashMap<(usize, u32), usize> = HashMap::new();
        for (i, s) in batch.sequences.iter().enumerate() {
            let end = s.start + s.tokens.len();
            if s.tokens.is_empty() {
                return refuse(format!("sequence {i} has no tokens"));
            }
            if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return refuse(format!(
                    "sequence {i}: token {t} is outside the vocabulary of {}",
                    c.vocab
                ));
            }
            if end > c.context_length {
                return refuse(format!(
                    "sequence {i}: positions up to {end} exceed the context length {}",
                    c.context_length
                ));
            }
            let mine = self.table_entries(i, s, stores)?;
            for &(p, writes) in &mine {
                if writes {
                    if let Some(j) = written.insert(p, i) {
                        let p = p.1;
                        return refuse(format!("page {p} is written by sequences {j} and {i}"));
                    }
                }
            }
            check_adapter(i, s, adapters)?;
            entries.push(mine);
        }
        for (i, mine) in entries.iter().enumerate() {
            if let Some(&(p, _)) = mine
                .iter()
                .find(|(p, _)| written.get(p).is_some_and(|&w| w != i))
            {
                return refuse(format!(
                    "page {} is in sequence {i}'s table and written by sequence {}",
                    p.1, written[&p]
                ));
            }
        }
        Ok(())
    }

    /// The pages sequence `i`'s step touches, each as (store, page) with whether the step writes
    /// it: the entries of its table (and of its local table, from the window of its first token
    /// on) up to its last position, checked in range of their store, each page once.
    fn table_entries(
        &self,
        i: usize,
        s: &Sequence<'_>,
        (layouts, gpu, places): (&[KvLayout], &[u32], &[Place]),
    ) -> Result<Vec<((usize, u32), bool)>> {
        let (tpb, end) = (layouts[0].tokens_per_block, s.start + s.tokens.len());
        let used = layouts[0].pages_for(end);
        let mut tables = vec![("", s.pages, 0, 0)];
        if let Some(local) = s.local_pages {
            let Some(w) = (0..places.len()).find_map(|l| self.config().window(l)) else {
                return refuse(format!(
                    "sequence {i} has a local page table, the model has no sliding-window layer"
                ));
            };
            let store = places.iter().find(|p| p.local).map_or(0, |p| p.store);
            tables.push((
                "local ",
                local,
                (s.start + 1).saturating_sub(w) / tpb,
                store,
            ));
        }
        let mut seen = std::collections::HashSet::with_capacity(2 * used);
        let mut out = Vec::with_capacity(2 * used);
        for (what, table, first, store) in tables {
            if table.len() < used {
                return refuse(format!(
                    "sequence {i}: {end} positions need {used} pages of {tpb}, the {what}table \
                     has {}",
                    table.len()
                ));
            }
            let gpu_pages = gpu[store];
            for (e, &p) in table.iter().enumerate().take(used).skip(first) {
                if p >= gpu_pages {
                    return refuse(format!(
                        "sequence {i}: page {p} is outside the {gpu_pages} GPU pages"
                    ));
                }
                if !seen.insert((store, p)) {
                    return refuse(format!("sequence {i}: page {p} appears twice in its table"));
                }
                out.push(((store, p), e >= s.start / tpb));
            }
        }
        Ok(out)
    }
}

/// The layout of each store: as many pieces a page as `places` puts layers in it, pages of the
/// same positions in all.
fn store_layouts(
    config: &crate::gguf::ModelConfig,
    stores: &[&mut HostKvStore],
    places: &[Place],
) -> Result<Vec<KvLayout>> {
    let layouts = stores
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let layers = places.iter().filter(|p| p.store == i).count();
            KvLayout::of_group_shape(config, s.shape(), layers)
        })
        .collect::<Result<Vec<_>>>()?;
    if layouts
        .iter()
        .any(|l| l.tokens_per_block != layouts[0].tokens_per_block)
    {
        return refuse("KV stores: the groups' pages hold different numbers of positions".into());
    }
    Ok(layouts)
}

/// Writes the step's new keys and values into each sequence's pages: each layer's into its store,
/// through the sequence's local table for a local layer when it has one, else its table.
fn write_kv(
    stores: &mut [&mut HostKvStore],
    layouts: &[KvLayout],
    (batch, spans): (&Batch<'_>, &[Span]),
    step: &StepKv,
    places: &[Place],
    buf: &mut Vec<u8>,
) -> Result<()> {
    for (s, span) in batch.sequences.iter().zip(spans) {
        let rows = (s.start, span.len, span.row0);
        let (k, v) = (&step.k, &step.v);
        for (store, kv) in stores.iter_mut().enumerate() {
            // The store's layers through the local table, then through the table.
            for local in [true, false] {
                let table = match (local, s.local_pages) {
                    (true, Some(t)) => t,
                    (true, None) => continue,
                    (false, _) => s.pages,
                };
                let layers: Vec<(usize, usize)> = (0..places.len())
                    .filter(|&l| {
                        let p = places[l];
                        p.store == store && (p.local && s.local_pages.is_some()) == local
                    })
                    .map(|l| (l, places[l].piece))
                    .collect();
                if !layers.is_empty() {
                    scatter(kv, &layouts[store], table, &layers, rows, k, v, buf)?;
                }
            }
        }
    }
    Ok(())
}

/// Sequence `i`'s adapter pages: an adapter store is given, and its pages are in its device tier.
fn check_adapter(i: usize, s: &Sequence<'_>, adapters: Option<&dyn PageStore>) -> Result<()> {
    if s.adapter.is_some() && adapters.is_none() {
        return refuse(format!(
            "sequence {i} has an adapter but no adapter store was given"
        ));
    }
    if let (Some(pages), Some(store)) = (s.adapter, adapters) {
        let n = store.shape().gpu_pages;
        if pages.is_empty() {
            return refuse(format!("sequence {i}: its adapter has no pages"));
        }
        if let Some(p) = pages.iter().find(|&&p| p >= n) {
            return refuse(format!(
                "sequence {i}: adapter page {p} is outside the {n} device pages"
            ));
        }
    }
    Ok(())
}
