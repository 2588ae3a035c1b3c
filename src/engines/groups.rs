//! KV cache groups of hybrid models, and which cached blocks make a reusable prefix.
//!
//! vLLM publishes each KV cache group's stores and removes with `group_idx`; stores
//! also name the group's `kv_cache_spec_kind` (and `kv_cache_spec_sliding_window`).
//! A hybrid model (gpt-oss, Gemma 3, Llama 4, Qwen3-Next) has full-attention groups
//! beside sliding-window, chunked-local or mamba groups. The engine reuses a prefix of
//! k blocks when every full-attention group holds all k blocks and every windowed group
//! holds the last blocks of its window before k (vLLM's `SlidingWindowManager` and
//! mamba's cached states at block boundaries).
//!
//! kvroute's index answers "the longest run of held blocks from the start", so the
//! adapter decides, per block and tier, whether the block is *present* in the index:
//! - it is held by every full-attention group learned so far (by any group when the
//!   model has no full-attention group), and
//! - every windowed group holds it too, or a block that continues it (a child in the
//!   engine's prefix tree) is present.
//!
//! So a chain whose windowed groups evicted its early blocks but kept its tail stays
//! reusable whole (the engine's hit for the whole chain), and a chain whose windowed
//! groups lost its tail is not reusable at all. Mamba and linear-attention groups keep
//! one state per block boundary: they are windowed groups with a window of one block,
//! for which this rule is exact. For a window of w > 1 blocks it is exact when the
//! windowed groups hold whole windows (vLLM frees and evicts a window's blocks
//! together) and may credit a prefix whose window is only partly held. A request that
//! diverges inside a chain is credited up to where it diverges, where the engine
//! needs a held window ending there; kvroute's index has no per-position window.
//!
//! Encoder-only and cross-attention groups are not prefix-cached and never make a block
//! present. Stores without `group_idx` are group 0; stores without a kind teach
//! "full attention". Group indices of [`MAX_GROUPS`] and above are refused.

/// Group indices accepted (0..MAX_GROUPS): far above the few groups vLLM forms.
pub const MAX_GROUPS: usize = 32;

/// How a group's holdings count toward a reusable prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// Must hold the whole prefix (full, MLA or sink attention, unknown kinds).
    Full,
    /// Must hold the last window of the prefix (sliding window, chunked local, mamba).
    Window,
    /// Not prefix-cached (encoder-only, cross attention).
    Ignored,
}

/// The kind of a group from its `kv_cache_spec_kind` (none: full attention).
pub fn classify(kind: Option<&str>) -> GroupKind {
    let Some(k) = kind else {
        return GroupKind::Full;
    };
    const WINDOW: [&str; 4] = [
        "sliding_window",
        "sliding_window_mla",
        "chunked_local_attention",
        "mamba",
    ];
    const IGNORED: [&str; 2] = ["encoder_only_attention", "cross_attention"];
    if WINDOW.iter().any(|w| k.eq_ignore_ascii_case(w)) {
        GroupKind::Window
    } else if IGNORED.iter().any(|w| k.eq_ignore_ascii_case(w)) {
        GroupKind::Ignored
    } else {
        GroupKind::Full
    }
}

/// The groups of one worker, learned from its stores.
#[derive(Clone, Debug, Default)]
pub struct Groups {
    full: u32,
    window: u32,
    ignored: u32,
}

impl Groups {
    /// Learns group `g`'s kind from a store carrying `kind`. True when the set of
    /// groups or a kind changed (the caller re-evaluates every block).
    pub fn learn(&mut self, g: usize, kind: Option<&str>) -> bool {
        let bit = 1u32 << g;
        let known = (self.full | self.window | self.ignored) & bit != 0;
        if known && kind.is_none() {
            return false;
        }
        let want = classify(kind);
        let (f, w, i) = (self.full, self.window, self.ignored);
        self.full &= !bit;
        self.window &= !bit;
        self.ignored &= !bit;
        match want {
            GroupKind::Full => self.full |= bit,
            GroupKind::Window => self.window |= bit,
            GroupKind::Ignored => self.ignored |= bit,
        }
        (f, w, i) != (self.full, self.window, self.ignored)
    }

    /// Whether a block held by the groups in `held` (bit per group) is present, given
    /// whether one of its children is present (module docs).
    pub fn present(&self, held: u32, child_present: bool) -> bool {
        let full_ok = if self.full != 0 {
            held & self.full == self.full
        } else {
            held & self.window != 0
        };
        let window_ok = held & self.window == self.window;
        full_ok && (window_ok || child_present)
    }

    /// True when some windowed group is known (children then matter).
    pub fn hybrid(&self) -> bool {
        self.window != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_groups_hold_everything_and_windows_only_the_tail() {
        let mut g = Groups::default();
        assert!(g.learn(0, Some("full_attention")));
        assert!(
            !g.learn(0, None),
            "a kind-less store keeps the learned kind"
        );
        assert!(g.present(0b1, false));
        assert!(g.learn(1, Some("sliding_window")));
        assert!(g.hybrid());
        assert!(g.present(0b11, false));
        assert!(!g.present(0b01, false), "window lost, no present child");
        assert!(
            g.present(0b01, true),
            "window lost, but a continuation is present"
        );
        assert!(!g.present(0b10, true), "full attention must hold it");
        assert!(g.learn(2, Some("encoder_only_attention")));
        assert!(!g.present(0b100, true));
        let mut m = Groups::default();
        m.learn(0, Some("mamba"));
        assert!(m.present(0b1, false), "a model of windowed groups only");
        assert_eq!(classify(Some("mla_attention")), GroupKind::Full);
        assert_eq!(classify(Some("something_new")), GroupKind::Full);
    }
}
