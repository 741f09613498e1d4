//! The `section!` macro: a settings struct written with each field's default beside it,
//! so a field and its default are one line to add and cannot drift apart.

/// Declares a settings struct and its [`Default`]: each field is written
/// `pub name: Type = default,` (its doc comment and attributes above it, as usual).
macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident : $ty:ty = $default:expr
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[$field_meta])*
                pub $field: $ty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $($field: $default,)*
                }
            }
        }
    };
}

pub(super) use section;
