//! Values: every clone is O(1) — observable as a shared payload — and `Opaque` is identity.

use std::sync::Arc;

use soma_core::Value;

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
