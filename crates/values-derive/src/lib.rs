//! Layer 2 of `distribute` (companion of distribute-values): `#[derive(Nest)]`.
//!
//! Generates, field by field, the `Regroup` and `Nest` impls, the regrouped companion struct and
//! its `Distributed` impl (which names the struct back), so that users write no per-field code. Knows nothing beyond the shape of the struct it is given; the
//! generated code names `::distribute_values`, which re-exports this macro.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::{Data, DeriveInput, Fields, Generics, Ident, Index, parse_macro_input, parse_quote};

/// See `distribute_values::Nest` (the derive is documented where it is re-exported).
#[proc_macro_derive(Nest, attributes(nest))]
pub fn derive_nest(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

fn expand(input: DeriveInput) -> syn::Result<TokenStream2> {
    if is_leaf(&input)? {
        return Ok(expand_leaf(&input));
    }
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "derive(Nest) supports structs; mark other types #[nest(leaf)] or implement Nest, \
             Regroup and Distributed by hand",
        ));
    };
    expand_struct(&input, &data.fields)
}

/// Whether the type carries `#[nest(leaf)]`; any other `nest` argument is an error.
fn is_leaf(input: &DeriveInput) -> syn::Result<bool> {
    let mut leaf = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("nest")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("leaf") {
                leaf = true;
                Ok(())
            } else {
                Err(meta.error("unknown nest attribute; the only one is #[nest(leaf)]"))
            }
        })?;
    }
    Ok(leaf)
}

fn expand_leaf(input: &DeriveInput) -> TokenStream2 {
    let name = &input.ident;
    let mut generics = input.generics.clone();
    for param in generics.type_params_mut() {
        param.bounds.push(parse_quote!(::core::clone::Clone));
        param.bounds.push(parse_quote!(::core::cmp::PartialEq));
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let nest_generics = with_bound(&input.generics, quote!('static));
    let (nest_impl, _, nest_where) = nest_generics.split_for_impl();
    quote! {
        impl #nest_impl ::distribute_values::Nest for #name #ty_generics #nest_where {
            fn visit_leaves<__V: ::distribute_values::LeafVisitor>(
                &self,
                path: &::distribute_values::Path<'_>,
                visitor: &mut __V,
            ) -> ::core::result::Result<(), __V::Error> {
                visitor.leaf(path, self)
            }

            fn map_leaves<__M: ::distribute_values::LeafMapper>(
                &self,
                path: &::distribute_values::Path<'_>,
                mapper: &mut __M,
            ) -> ::core::result::Result<Self, __M::Error> {
                mapper.leaf(path, self)
            }

            fn zip_leaves<__Z: ::distribute_values::LeafZipper>(
                parts: &[&Self],
                path: &::distribute_values::Path<'_>,
                zipper: &mut __Z,
            ) -> ::core::result::Result<Self, __Z::Error> {
                zipper.leaf(path, parts)
            }
        }

        impl #impl_generics ::distribute_values::Regroup for #name #ty_generics #where_clause {
            type Regrouped = ::distribute_values::Leaf<Self>;

            fn regroup_replicas(
                replicas: ::std::vec::Vec<Self>,
                cx: &::distribute_values::RegroupContext<'_>,
                path: &::distribute_values::Path<'_>,
            ) -> ::core::result::Result<Self::Regrouped, ::distribute_values::ValuesError> {
                ::distribute_values::Leaf::regroup_leaf(replicas, cx, path)
            }

            fn select(
                regrouped: &Self::Regrouped,
                selection: ::distribute_values::Selection<'_>,
                path: &::distribute_values::Path<'_>,
            ) -> ::core::result::Result<Self, ::distribute_values::ValuesError> {
                regrouped.select_leaf(selection, path)
            }
        }
    }
}

fn expand_struct(input: &DeriveInput, fields: &Fields) -> syn::Result<TokenStream2> {
    let name = &input.ident;
    let vis = &input.vis;
    let companion = format_ident!("{}Regrouped", name);
    let mut generics = input.generics.clone();
    for param in generics.type_params_mut() {
        param
            .bounds
            .push(parse_quote!(::distribute_values::Regroup));
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();

    // One member per field: `a` for named fields, `0` for tuple fields.
    let members: Vec<TokenStream2> = fields
        .iter()
        .enumerate()
        .map(|(i, f)| match &f.ident {
            Some(ident) => quote!(#ident),
            None => {
                let index = Index::from(i);
                quote!(#index)
            }
        })
        .collect();
    let labels: Vec<String> = fields
        .iter()
        .enumerate()
        .map(|(i, f)| {
            f.ident
                .as_ref()
                .map_or_else(|| i.to_string(), Ident::to_string)
        })
        .collect();
    let columns: Vec<Ident> = (0..members.len())
        .map(|i| Ident::new(&format!("__column{i}"), Span::call_site()))
        .collect();
    let types: Vec<&syn::Type> = fields.iter().map(|f| &f.ty).collect();
    let field_vis: Vec<&syn::Visibility> = fields.iter().map(|f| &f.vis).collect();

    let companion_doc = format!(
        "[`{name}`] regrouped across replicas: each field holds its field's regrouped value \
         (generated by `#[derive(Nest)]`)."
    );
    let companion_body = match fields {
        Fields::Named(_) => quote! {
            { #( #field_vis #members: <#types as ::distribute_values::Regroup>::Regrouped, )* }
        },
        Fields::Unnamed(_) => quote! {
            ( #( #field_vis <#types as ::distribute_values::Regroup>::Regrouped, )* ) #where_clause;
        },
        Fields::Unit => quote!(#where_clause;),
    };
    // A tuple struct's where clause follows its fields.
    let declaration_where = match fields {
        Fields::Named(_) => where_clause.map(|w| quote!(#w)),
        Fields::Unnamed(_) | Fields::Unit => None,
    };
    let build = |values: &dyn Fn(usize) -> TokenStream2| -> TokenStream2 {
        let values: Vec<TokenStream2> = (0..members.len()).map(values).collect();
        match fields {
            Fields::Named(_) => quote!({ #( #members: #values, )* }),
            Fields::Unnamed(_) => quote!(( #( #values, )* )),
            Fields::Unit => quote!(),
        }
    };
    let regrouped_value = build(&|i| {
        let (ty, column, label) = (types[i], &columns[i], &labels[i]);
        quote!(<#ty as ::distribute_values::Regroup>::regroup_replicas(#column, cx, &path.field(#label))?)
    });
    let selected_value = build(&|i| {
        let (ty, member, label) = (types[i], &members[i], &labels[i]);
        quote!(<#ty as ::distribute_values::Regroup>::select(&regrouped.#member, selection, &path.field(#label))?)
    });

    let companion_impls = companion_impls(&generics, &companion, fields, &members, &labels, &types);

    let visited: Vec<TokenStream2> = (0..members.len())
        .map(|i| {
            let (ty, member, label) = (types[i], &members[i], &labels[i]);
            quote!(<#ty as ::distribute_values::Nest>::visit_leaves(&self.#member, &path.field(#label), visitor)?;)
        })
        .collect();
    let mapped_value = build(&|i| {
        let (ty, member, label) = (types[i], &members[i], &labels[i]);
        quote!(<#ty as ::distribute_values::Nest>::map_leaves(&self.#member, &path.field(#label), mapper)?)
    });
    let zipped_value = build(&|i| {
        let (ty, member, label) = (types[i], &members[i], &labels[i]);
        quote!({
            let __column: ::std::vec::Vec<&#ty> = parts.iter().map(|p| &p.#member).collect();
            <#ty as ::distribute_values::Nest>::zip_leaves(&__column, &path.field(#label), zipper)?
        })
    });
    let nest_generics = with_bound(&input.generics, quote!(::distribute_values::Nest));
    let (nest_impl, _, nest_where) = nest_generics.split_for_impl();

    Ok(quote! {
        #[doc = #companion_doc]
        #[allow(missing_docs)]
        #vis struct #companion #impl_generics #declaration_where #companion_body

        #companion_impls

        impl #impl_generics ::distribute_values::Distributed for #companion #ty_generics #where_clause {
            type Local = #name #ty_generics;
        }

        impl #nest_impl ::distribute_values::Nest for #name #ty_generics #nest_where {
            fn visit_leaves<__V: ::distribute_values::LeafVisitor>(
                &self,
                path: &::distribute_values::Path<'_>,
                visitor: &mut __V,
            ) -> ::core::result::Result<(), __V::Error> {
                let _ = (path, &visitor);
                #( #visited )*
                ::core::result::Result::Ok(())
            }

            fn map_leaves<__M: ::distribute_values::LeafMapper>(
                &self,
                path: &::distribute_values::Path<'_>,
                mapper: &mut __M,
            ) -> ::core::result::Result<Self, __M::Error> {
                let _ = (path, &mapper);
                ::core::result::Result::Ok(#name #mapped_value)
            }

            fn zip_leaves<__Z: ::distribute_values::LeafZipper>(
                parts: &[&Self],
                path: &::distribute_values::Path<'_>,
                zipper: &mut __Z,
            ) -> ::core::result::Result<Self, __Z::Error> {
                let _ = (parts, path, &zipper);
                ::core::result::Result::Ok(#name #zipped_value)
            }
        }

        impl #impl_generics ::distribute_values::Regroup for #name #ty_generics #where_clause {
            type Regrouped = #companion #ty_generics;

            fn regroup_replicas(
                replicas: ::std::vec::Vec<Self>,
                cx: &::distribute_values::RegroupContext<'_>,
                path: &::distribute_values::Path<'_>,
            ) -> ::core::result::Result<Self::Regrouped, ::distribute_values::ValuesError> {
                #( let mut #columns = ::std::vec::Vec::with_capacity(replicas.len()); )*
                let _ = (cx, path);
                for __replica in replicas {
                    #( #columns.push(__replica.#members); )*
                }
                ::core::result::Result::Ok(#companion #regrouped_value)
            }

            fn select(
                regrouped: &Self::Regrouped,
                selection: ::distribute_values::Selection<'_>,
                path: &::distribute_values::Path<'_>,
            ) -> ::core::result::Result<Self, ::distribute_values::ValuesError> {
                let _ = (regrouped, selection, path);
                ::core::result::Result::Ok(#name #selected_value)
            }
        }
    })
}

/// `generics` with `bound` added to every type parameter.
fn with_bound(generics: &Generics, bound: TokenStream2) -> Generics {
    let mut generics = generics.clone();
    for param in generics.type_params_mut() {
        param.bounds.push(parse_quote!(#bound));
    }
    generics
}

/// `Debug`, `Clone` and `PartialEq` for the companion, bounded on the fields' regrouped types:
/// std's derives would bound the type parameters instead, which says nothing about
/// `<T as Regroup>::Regrouped`.
fn companion_impls(
    generics: &Generics,
    companion: &Ident,
    fields: &Fields,
    members: &[TokenStream2],
    labels: &[String],
    types: &[&syn::Type],
) -> TokenStream2 {
    let params: Vec<&Ident> = generics.type_params().map(|p| &p.ident).collect();
    // Only fields that involve a type parameter need a bound; bounding concrete field types
    // would make a recursive struct's impls depend on themselves.
    let generic_types: Vec<&&syn::Type> = types
        .iter()
        .filter(|ty| mentions_any(quote!(#ty), &params))
        .collect();
    let bounded = |bound: TokenStream2| -> Generics {
        let mut generics = generics.clone();
        let where_clause = generics.make_where_clause();
        for ty in &generic_types {
            where_clause
                .predicates
                .push(parse_quote!(<#ty as ::distribute_values::Regroup>::Regrouped: #bound));
        }
        generics
    };
    let clone_generics = bounded(quote!(::core::clone::Clone));
    let eq_generics = bounded(quote!(::core::cmp::PartialEq));
    let debug_generics = bounded(quote!(::core::fmt::Debug));
    let (clone_impl, ty_generics, clone_where) = clone_generics.split_for_impl();
    let (eq_impl, _, eq_where) = eq_generics.split_for_impl();
    let (debug_impl, _, debug_where) = debug_generics.split_for_impl();

    let clones: Vec<TokenStream2> = members
        .iter()
        .map(|m| quote!(::core::clone::Clone::clone(&self.#m)))
        .collect();
    let clone_body = match fields {
        Fields::Named(_) => quote!(#companion { #( #members: #clones, )* }),
        Fields::Unnamed(_) => quote!(#companion ( #( #clones, )* )),
        Fields::Unit => quote!(#companion),
    };
    let companion_name = companion.to_string();
    let debug_body = match fields {
        Fields::Named(_) => quote! {
            f.debug_struct(#companion_name) #( .field(#labels, &self.#members) )* .finish()
        },
        Fields::Unnamed(_) => quote! {
            f.debug_tuple(#companion_name) #( .field(&self.#members) )* .finish()
        },
        Fields::Unit => quote!(f.write_str(#companion_name)),
    };
    quote! {
        impl #clone_impl ::core::clone::Clone for #companion #ty_generics #clone_where {
            fn clone(&self) -> Self {
                #clone_body
            }
        }

        impl #eq_impl ::core::cmp::PartialEq for #companion #ty_generics #eq_where {
            fn eq(&self, other: &Self) -> bool {
                let _ = other;
                true #( && self.#members == other.#members )*
            }
        }

        impl #debug_impl ::core::fmt::Debug for #companion #ty_generics #debug_where {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                #debug_body
            }
        }
    }
}

/// Whether `tokens` contain one of the identifiers `idents`, at any depth.
fn mentions_any(tokens: TokenStream2, idents: &[&Ident]) -> bool {
    tokens.into_iter().any(|token| match token {
        proc_macro2::TokenTree::Ident(ident) => idents.iter().any(|i| **i == ident),
        proc_macro2::TokenTree::Group(group) => mentions_any(group.stream(), idents),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(source: &str) -> Result<String, String> {
        let input: DeriveInput = syn::parse_str(source).unwrap();
        expand(input)
            .map(|tokens| tokens.to_string())
            .map_err(|err| err.to_string())
    }

    #[test]
    fn structs_get_a_companion_and_an_impl() {
        let out = expand_str("pub struct Spec { pub mode: String, loss: f32 }").unwrap();
        assert!(out.contains("pub struct SpecRegrouped"), "{out}");
        assert!(
            out.contains("impl :: distribute_values :: Regroup for Spec"),
            "{out}"
        );
        assert!(out.contains("path . field (\"loss\")"), "{out}");
        assert!(
            out.contains("impl :: distribute_values :: Nest for Spec"),
            "{out}"
        );
        assert!(
            out.contains("impl :: distribute_values :: Distributed for SpecRegrouped"),
            "{out}"
        );
        assert!(out.contains("type Local = Spec"), "{out}");
    }

    #[test]
    fn generic_parameters_get_each_trait_as_their_bound() {
        let out = expand_str("struct Pair<T> { a: T, b: Vec<T> }").unwrap();
        assert!(
            out.contains("impl < T : :: distribute_values :: Nest > :: distribute_values :: Nest for Pair < T >"),
            "{out}"
        );
        assert!(
            out.contains("impl < T : :: distribute_values :: Regroup > :: distribute_values :: Regroup for Pair < T >"),
            "{out}"
        );
    }

    #[test]
    fn leaves_get_no_companion() {
        let out = expand_str("#[nest(leaf)] struct Token<T>(T);").unwrap();
        assert!(!out.contains("TokenRegrouped"), "{out}");
        assert!(out.contains("Leaf < Self >"), "{out}");
        assert!(out.contains("visitor . leaf (path , self)"), "{out}");
        assert!(out.contains("impl < T : 'static >"), "{out}");
    }

    #[test]
    fn enums_and_unknown_attributes_are_refused_with_a_hint() {
        let err = expand_str("enum E { A, B }").unwrap_err();
        assert!(err.contains("#[nest(leaf)]"), "{err}");
        let err = expand_str("#[nest(flatten)] struct S;").unwrap_err();
        assert!(err.contains("the only one is #[nest(leaf)]"), "{err}");
    }
}
