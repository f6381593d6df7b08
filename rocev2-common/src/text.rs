//! The text form of the enums that configs, flags, JSON and output name:
//! one macro so each enum's `Display`, `FromStr` and "unknown name" error
//! are written once.

/// For an enum with `const ALL: [Self; N]` and `const fn name(self)`:
/// `Display` prints the name, `FromStr` parses it, and the error type
/// `$unknown` displays `$help` (which names the choices).
#[macro_export]
macro_rules! text_form {
    ($ty:ty, $unknown:ident, $help:literal) => {
        impl core::fmt::Display for $ty {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(self.name())
            }
        }

        /// A name that names none of the choices; displays which do.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $unknown;

        impl core::fmt::Display for $unknown {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str($help)
            }
        }

        impl core::str::FromStr for $ty {
            type Err = $unknown;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                <$ty>::ALL.into_iter().find(|v| v.name() == s).ok_or($unknown)
            }
        }
    };
}
