//! `#[derive(Equivalence)]` for pagewire, as rsmpi's `mpi-derive` offers it: the datatype of
//! a struct is a structured datatype of its fields' datatypes at their offsets, with the
//! struct's size as extent, built once (on first use) and kept for the life of the process.
//! Fields may be any type that is `Equivalence`, tuples and arrays of them.
//!
//! The generated code names the pagewire crate as the deriving crate depends on it: `mpi`
//! when it replaced rsmpi (`mpi = { package = "pagewire", ... }`), `pagewire` when it uses
//! it under its own name; this is read from the crate's `Cargo.toml`.
#![forbid(unsafe_code)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::quote;
use syn::{parse_macro_input, Data, DeriveInput, Fields, Ident, Index, Member, Type};

/// Implements `Equivalence` for a struct (named, tuple or unit fields, no generics).
#[proc_macro_derive(Equivalence)]
pub fn derive_equivalence(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let name = &input.ident;
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &input.generics,
            "#[derive(Equivalence)] does not support generic types",
        ));
    }
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            name,
            "#[derive(Equivalence)] supports structs only",
        ));
    };
    let krate = crate_path();
    let fields: Vec<(Member, &Type)> = match &data.fields {
        Fields::Named(f) => f
            .named
            .iter()
            .map(|f| {
                (
                    Member::Named(f.ident.clone().expect("a named field")),
                    &f.ty,
                )
            })
            .collect(),
        Fields::Unnamed(f) => f
            .unnamed
            .iter()
            .enumerate()
            .map(|(i, f)| (Member::Unnamed(Index::from(i)), &f.ty))
            .collect(),
        Fields::Unit => Vec::new(),
    };
    let members = fields.iter().map(|(m, _)| m);
    let types = fields.iter().map(|(_, t)| datatype_of(t, &krate));
    let n = fields.len();
    Ok(quote! {
        #[allow(unsafe_code)]
        // SAFETY: the datatype describes each field at its offset, with its own datatype.
        unsafe impl #krate::datatype::Equivalence for #name {
            type Out = #krate::datatype::DatatypeRef<'static>;
            fn equivalent_datatype() -> Self::Out {
                static DATATYPE: ::std::sync::OnceLock<#krate::datatype::UserDatatype> =
                    ::std::sync::OnceLock::new();
                DATATYPE
                    .get_or_init(|| {
                        #krate::datatype::internal::check_derive_equivalence_universe_state(
                            ::core::stringify!(#name),
                        );
                        let types: [#krate::datatype::UserDatatype; #n] = [#(#types),*];
                        let offsets: [#krate::datatype::Address; #n] =
                            [#(::core::mem::offset_of!(#name, #members) as #krate::datatype::Address),*];
                        let lengths: [#krate::datatype::Count; #n] = [1; #n];
                        #krate::datatype::internal::with_extent(
                            #krate::datatype::UserDatatype::structured(&lengths, &offsets, &types),
                            ::core::mem::size_of::<#name>(),
                        )
                    })
                    .as_ref()
            }
        }
    })
}

/// An expression of type `UserDatatype` for the field type `ty`.
fn datatype_of(ty: &Type, krate: &Tokens) -> Tokens {
    match ty {
        Type::Paren(p) => datatype_of(&p.elem, krate),
        Type::Group(g) => datatype_of(&g.elem, krate),
        Type::Array(a) => {
            let elem = datatype_of(&a.elem, krate);
            let len = &a.len;
            quote! {
                #krate::datatype::UserDatatype::contiguous((#len) as #krate::datatype::Count, &#elem)
            }
        }
        Type::Tuple(t) => {
            let n = t.elems.len();
            let types = t.elems.iter().map(|e| datatype_of(e, krate));
            let indices = (0..n).map(Index::from);
            quote! {{
                type Tuple = #ty;
                let types: [#krate::datatype::UserDatatype; #n] = [#(#types),*];
                let offsets: [#krate::datatype::Address; #n] =
                    [#(::core::mem::offset_of!(Tuple, #indices) as #krate::datatype::Address),*];
                let lengths: [#krate::datatype::Count; #n] = [1; #n];
                #krate::datatype::internal::with_extent(
                    #krate::datatype::UserDatatype::structured(&lengths, &offsets, &types),
                    ::core::mem::size_of::<Tuple>(),
                )
            }}
        }
        _ => quote! {
            #krate::datatype::internal::user(
                &<#ty as #krate::datatype::Equivalence>::equivalent_datatype(),
            )
        },
    }
}

/// How the deriving crate names pagewire (see the crate documentation).
fn crate_path() -> Tokens {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("CARGO_CRATE_NAME") == "pagewire" {
        return quote!(crate);
    }
    if var("CARGO_PKG_NAME") == "pagewire" {
        return quote!(::pagewire);
    }
    let manifest = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let name = std::fs::read_to_string(manifest)
        .ok()
        .and_then(|text| dependency_name(&text))
        .unwrap_or_else(|| "mpi".to_string());
    let ident = Ident::new(&name.replace('-', "_"), Span::call_site());
    quote!(::#ident)
}

/// The name under which a manifest depends on pagewire: the key of an entry with
/// `package = "pagewire"`, or `pagewire` itself.
fn dependency_name(manifest: &str) -> Option<String> {
    let mut table = String::new();
    let mut plain = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            table = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let renamed = line.contains("package") && line.contains("\"pagewire\"");
        if renamed {
            if let Some(key) = table.strip_prefix("dependencies.") {
                return Some(key.to_string());
            }
            if let Some((key, _)) = line.split_once('=') {
                return Some(key.trim().to_string());
            }
        }
        if table.ends_with("dependencies") && line.starts_with("pagewire") {
            let key = line.split(['=', ' ']).next().unwrap_or_default();
            plain |= key == "pagewire";
        }
    }
    plain.then(|| "pagewire".to_string())
}

#[cfg(test)]
mod tests {
    use super::dependency_name;

    #[test]
    fn finds_the_name_pagewire_goes_by() {
        let renamed = "[dependencies]\nmpi = { package = \"pagewire\", path = \"..\" }\n";
        assert_eq!(dependency_name(renamed).as_deref(), Some("mpi"));
        let table = "[dependencies.mpi]\npackage = \"pagewire\"\npath = \"..\"\n";
        assert_eq!(dependency_name(table).as_deref(), Some("mpi"));
        let plain = "[dependencies]\npagewire = { path = \"..\" }\n";
        assert_eq!(dependency_name(plain).as_deref(), Some("pagewire"));
        assert_eq!(dependency_name("[dependencies]\nserde = \"1\"\n"), None);
    }
}
