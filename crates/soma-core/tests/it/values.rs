//! Values: every clone is O(1) — observable as a shared payload — and `Opaque` is identity;
//! a value nested 100,000 levels deep drops, compares and prints on a small stack.

use std::sync::Arc;

use std::fmt;

use soma_core::Value;

use crate::support::on_a_small_stack;

#[test]
fn cloning_an_opaque_value_shares_its_payload() {
    let value = Value::opaque(vec![0_u8; 1 << 20]);
    let copy = value.clone();
    let (Value::Opaque(a), Value::Opaque(b)) = (&value, &copy) else {
        panic!("an opaque value clones into an opaque value");
    };
    assert!(Arc::ptr_eq(a, b));
}

#[test]
fn cloning_text_bytes_lists_and_maps_shares_their_buffers() {
    let text = Value::text("a long text");
    let bytes = Value::Bytes(Arc::from(&b"raw"[..]));
    let list = Value::list([Value::Int(1), Value::Int(2)]);
    let map = Value::map([("k", Value::Int(1))]);
    match (&text, &text.clone()) {
        (Value::Text(a), Value::Text(b)) => assert!(Arc::ptr_eq(a, b)),
        other => panic!("{other:?}"),
    }
    match (&bytes, &bytes.clone()) {
        (Value::Bytes(a), Value::Bytes(b)) => assert!(Arc::ptr_eq(a, b)),
        other => panic!("{other:?}"),
    }
    match (&list, &list.clone()) {
        (Value::List(a), Value::List(b)) => assert!(Arc::ptr_eq(a, b)),
        other => panic!("{other:?}"),
    }
    match (&map, &map.clone()) {
        (Value::Map(a), Value::Map(b)) => assert!(Arc::ptr_eq(a, b)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_opaque_value_equals_its_clone_but_not_an_equal_payload() {
    let value = Value::opaque(42_i32);
    assert_eq!(value, value.clone());
    assert_ne!(value, Value::opaque(42_i32));
}

#[test]
fn native_values_compare_by_content() {
    assert_eq!(Value::text("x"), Value::from("x"));
    assert_eq!(
        Value::list([Value::Int(1), Value::Null]),
        Value::list([Value::Int(1), Value::Null])
    );
    assert_eq!(
        Value::map([("a", Value::Bool(true))]),
        Value::map([(String::from("a"), Value::Bool(true))])
    );
    assert_ne!(
        Value::map([("a", Value::Int(1)), ("b", Value::Int(2))]),
        Value::map([("b", Value::Int(2)), ("a", Value::Int(1))]),
        "a map is ordered pairs"
    );
}

#[test]
fn values_of_different_kinds_are_never_equal() {
    assert_ne!(Value::Int(1), Value::Float(1.0));
    assert_ne!(Value::Null, Value::Bool(false));
    assert_ne!(Value::text("1"), Value::Int(1));
    assert_ne!(Value::list([]), Value::map::<&str>([]));
}

#[test]
fn map_get_finds_a_value_by_key() {
    let map = Value::map([("a", Value::Int(1)), ("b", Value::Int(2))]);
    assert_eq!(map.get("b"), Some(&Value::Int(2)));
    assert_eq!(map.get("c"), None);
    assert_eq!(Value::Int(1).get("a"), None, "only a map has keys");
}

#[test]
fn a_map_keeps_its_pairs_in_the_order_given() {
    let map = Value::map([("z", Value::Int(1)), ("a", Value::Int(2))]);
    let keys: Vec<&str> = map.as_map().unwrap().iter().map(|(k, _)| &**k).collect();
    assert_eq!(keys, ["z", "a"]);
}

#[test]
fn accessors_answer_only_for_their_own_variant() {
    assert_eq!(Value::Int(3).as_int(), Some(3));
    assert_eq!(Value::Float(0.5).as_float(), Some(0.5));
    assert_eq!(
        Value::Int(3).as_float(),
        None,
        "an int is not silently widened"
    );
    assert_eq!(Value::Float(3.0).as_int(), None);
    assert_eq!(Value::text("t").as_text(), Some("t"));
    assert_eq!(Value::Int(3).as_text(), None);
    assert_eq!(
        Value::list([Value::Null]).as_list(),
        Some(&[Value::Null][..])
    );
    assert!(Value::Null.as_list().is_none());
    assert!(Value::list([]).as_map().is_none());
}

#[test]
fn an_opaque_value_downcasts_only_to_its_own_type() {
    let value = Value::opaque(String::from("inside"));
    assert_eq!(
        value.downcast_ref::<String>().map(String::as_str),
        Some("inside")
    );
    assert!(value.downcast_ref::<i32>().is_none());
    assert!(Value::text("inside").downcast_ref::<String>().is_none());
}

#[test]
fn kind_names_each_variant() {
    let all = [
        (Value::Null, "Null"),
        (Value::from(true), "Bool"),
        (Value::from(1_i64), "Int"),
        (Value::from(1.5), "Float"),
        (Value::from("t"), "Text"),
        (Value::Bytes(Arc::from(&[1_u8][..])), "Bytes"),
        (Value::list([]), "List"),
        (Value::map::<&str>([]), "Map"),
        (Value::opaque(()), "Opaque"),
    ];
    for (value, kind) in all {
        assert_eq!(value.kind(), kind);
    }
}

#[test]
fn rust_scalars_and_strings_convert_into_their_variants() {
    assert_eq!(Value::from(true), Value::Bool(true));
    assert_eq!(Value::from(7_i64), Value::Int(7));
    assert_eq!(Value::from(0.25), Value::Float(0.25));
    assert_eq!(Value::from("s"), Value::text("s"));
    assert_eq!(Value::from(String::from("s")), Value::text("s"));
}

/// Levels of the deep values: one recursive frame per level would overflow the small stack
/// many times over.
const LEVELS: usize = 100_000;

/// `[[[… [0] …]]]`, `levels` lists deep, with a map every third level (`{"k": …}`), built in a
/// loop.
fn deep(levels: usize, bottom: Value) -> Value {
    (0..levels).fold(bottom, |inner, level| {
        if level % 3 == 2 {
            Value::map([("k", inner)])
        } else {
            Value::list([Value::Null, inner])
        }
    })
}

#[test]
fn a_value_nested_a_hundred_thousand_levels_deep_drops_on_a_small_stack() {
    on_a_small_stack(|| drop(deep(LEVELS, Value::Int(0))));
}

#[test]
fn a_deep_value_shared_by_two_holders_drops_with_the_last_on_a_small_stack() {
    on_a_small_stack(|| {
        let inner = deep(LEVELS, Value::Int(0));
        let outer = Value::list([inner.clone(), deep(LEVELS, Value::Int(1))]);
        drop(inner);
        assert_eq!(outer.as_list().map(<[Value]>::len), Some(2));
        drop(outer);
    });
}

#[test]
fn a_deep_value_clones_and_compares_on_a_small_stack() {
    on_a_small_stack(|| {
        let value = deep(LEVELS, Value::Int(0));
        assert_eq!(value.clone(), value);
        assert_eq!(
            deep(LEVELS, Value::Int(0)),
            value,
            "equal content, other buffers"
        );
        assert_ne!(
            deep(LEVELS, Value::Int(1)),
            value,
            "a difference at the very bottom is found"
        );
        assert_ne!(deep(LEVELS - 1, Value::Int(0)), value);
    });
}

#[test]
fn a_deep_value_debug_prints_on_a_small_stack() {
    on_a_small_stack(|| {
        let printed = format!("{:?}", deep(LEVELS, Value::Int(0)));
        assert!(printed.starts_with("[Null, {\"k\": [Null, [Null, {\"k\": "));
        assert!(
            printed.contains("[Null, {\"k\": [Null, [Null, Int(0)]]}]"),
            "levels 3 to 0"
        );
        assert!(printed.ends_with("]]}]"));
        // Pretty, each line indented by its depth: quadratic text, so a shallower value.
        let pretty = format!("{:#?}", deep(2_000, Value::Int(0)));
        assert!(pretty
            .starts_with("[\n    Null,\n    [\n        Null,\n        {\n            \"k\": [\n"));
        assert!(pretty.ends_with("            ],\n        },\n    ],\n]"));
    });
}

/// A value printed by `std`'s own `debug_list` and `debug_map`, recursively: what
/// `Value`'s `Debug` must print, for values shallow enough to recurse over.
struct AsStd<'v>(&'v Value);

impl fmt::Debug for AsStd<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Value::List(items) => f.debug_list().entries(items.iter().map(AsStd)).finish(),
            Value::Map(pairs) => f
                .debug_map()
                .entries(pairs.iter().map(|(k, v)| (&**k, AsStd(v))))
                .finish(),
            scalar => scalar.fmt(f),
        }
    }
}

#[test]
fn debug_prints_lists_and_maps_as_debug_list_and_debug_map_do() {
    let values = [
        Value::list([]),
        Value::map::<&str>([]),
        Value::list([Value::Int(1), Value::text("a\"b"), Value::Float(0.5)]),
        Value::map([("a", Value::list([])), ("b", Value::map::<&str>([]))]),
        Value::map([
            (
                "x",
                Value::list([Value::Null, Value::map([("y", Value::Bool(true))])]),
            ),
            ("z", Value::Bytes(Arc::from(&b"ab"[..]))),
        ]),
        Value::list([
            Value::list([Value::list([])]),
            Value::Int(-3),
            Value::list([]),
        ]),
        deep(7, Value::opaque(1_u8)),
    ];
    for value in &values {
        assert_eq!(format!("{value:?}"), format!("{:?}", AsStd(value)));
        assert_eq!(format!("{value:#?}"), format!("{:#?}", AsStd(value)));
    }
}
