//! The two declarations every layer repeats, written once: the allocating form of a `*_in` call
//! (see the [module docs](super)) and the layer type that holds a checked shape and the caller's
//! weights. Each layer states only what differs (its checks, its workspace size, its inputs), so
//! the forms cannot drift apart: every allocating form checks before allocating and runs the
//! `*_in` form on the buffer, every layer type forwards to the free functions.

/// Declares `pub fn $name<G…>(args…, par)` (each `G` an element type, bound by
/// [`Convertible`](crate::arch::convert::Convertible)), the allocating form of
/// `$name_in(args…, workspace, par)`:
/// it runs `checks` (the reference's checks, so an invalid call fails with the same error before
/// anything is allocated), allocates `workspace` zeroed `f32`s (an error, not an abort, when that
/// is impossible) and runs `$name_in` on them, so both forms return bitwise-equal results.
macro_rules! allocating_form {
    (
        $(#[$attr:meta])*
        pub fn $name:ident<$($g:ident),+>($($arg:ident: $ty:ty),+ $(,)?) => $name_in:ident;
        checks: $checks:expr;
        workspace: $len:expr;
    ) => {
        $(#[$attr])*
        pub fn $name<$($g: $crate::arch::convert::Convertible),+>(
            $($arg: $ty,)+
            par: $crate::par::Parallelism,
        ) -> ::attn_core::Result<()> {
            $checks?;
            let mut ws = $crate::layers::workspace::alloc($len)?;
            $name_in($($arg,)+ &mut ws, par)
        }
    };
}

/// Declares a layer type `$Name<'w>` holding a config and the caller's weights, checked once by
/// `new` (`checks`, then the config's and the weights' own `check`), with `config`,
/// `workspace_len` (the `$len_fn` of its config) and `forward` / `forward_in` forwarding to the
/// allocating and the `*_in` free functions. `$noun` names the layer in the generated docs.
macro_rules! layer_type {
    (
        $(#[$attr:meta])*
        pub struct $Name:ident<'w> { cfg: $Cfg:ty, weights: $W:ident, noun: $noun:literal }
        $(#[$new_doc:meta])*
        fn new($cfg:ident, $weights:ident) { $($checks:expr;)* }
        $(#[$len_doc:meta])*
        fn workspace_len($($n:ident),+) = $len_fn:ident($($len_arg:expr),+);
        fn forward<$a:ident>($($arg:ident: $ty:ty),+) = $fwd:ident, $fwd_in:ident;
    ) => {
        $(#[$attr])*
        ///
        /// `T` is the weights' element type (f32, bf16 or f16); `forward` takes activations of
        /// any of the three (`A`).
        #[derive(Clone, Copy, Debug)]
        pub struct $Name<'w, T = f32> {
            cfg: $Cfg,
            weights: $W<'w, T>,
        }

        impl<'w, T: $crate::arch::convert::Convertible> $Name<'w, T> {
            $(#[$new_doc])*
            pub fn new($cfg: $Cfg, $weights: $W<'w, T>) -> ::attn_core::Result<Self> {
                $($checks;)*
                $cfg.check()?;
                $weights.check(&$cfg)?;
                Ok(Self { cfg: $cfg, weights: $weights })
            }
            #[doc = concat!("The ", $noun, "'s shape.")]
            pub fn config(&self) -> &$Cfg {
                &self.cfg
            }
            $(#[$len_doc])*
            pub fn workspace_len(&self, $($n: usize),+) -> usize {
                $len_fn(&self.cfg, $($len_arg),+)
            }
            #[doc = concat!("[`", stringify!($fwd), "`] with this ", $noun, "'s weights.")]
            pub fn forward<$a: $crate::arch::convert::Convertible>(
                &self,
                $($arg: $ty,)+
                par: $crate::par::Parallelism,
            ) -> ::attn_core::Result<()> {
                $fwd(&self.cfg, &self.weights, $($arg,)+ par)
            }
            #[doc = concat!("[`", stringify!($fwd_in), "`] with this ", $noun, "'s weights.")]
            pub fn forward_in<$a: $crate::arch::convert::Convertible>(
                &self,
                $($arg: $ty,)+
                workspace: &mut [f32],
                par: $crate::par::Parallelism,
            ) -> ::attn_core::Result<()> {
                $fwd_in(&self.cfg, &self.weights, $($arg,)+ workspace, par)
            }
        }
    };
}
