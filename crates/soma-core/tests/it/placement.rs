//! Placement: devices read as torch spells them and refused where written when they cannot be;
//! a placement never changes the plan or a result; each placed node is told its device, and
//! traces and drawings show it.

use std::sync::Arc;

use proptest::prelude::*;
use soma_core::{
    compile, node, node_arc, Catalog, Ctx, Device, DeviceError, DeviceKind, Executor, Node,
    NodeError, Placement, Program, Trace, Transition, Value,
};

fn device(text: &str) -> Device {
    text.parse().unwrap_or_else(|e| panic!("`{text}`: {e}"))
}

#[test]
fn devices_are_read_as_torch_spells_them_and_shown_the_same_way() {
    for text in [
        "cpu", "cpu:0", "cuda:0", "cuda:13", "meta", "mps", "mps:0", "xpu:1", "hip:0",
    ] {
        assert_eq!(device(text).to_string(), text);
    }
    assert_eq!(device("cuda:1").kind(), DeviceKind::Cuda);
    assert_eq!(device("cuda:1").index(), Some(1));
    assert_eq!(device("meta").index(), None);
}

#[test]
fn a_malformed_device_is_refused_where_it_is_written() {
    for text in [
        "",
        ":0",
        "cuda:",
        "cuda:-1",
        "cuda:x",
        "cuda:0:1",
        "cuda:99999999999",
        "CUDA",
    ] {
        assert!(
            matches!(text.parse::<Device>(), Err(DeviceError::Malformed { .. })),
            "`{text}`"
        );
    }
}

#[test]
fn a_device_spelled_otherwise_than_torch_spells_it_is_refused_naming_the_spelling() {
    for (text, canonical) in [
        ("cuda:01", "cuda:1"),
        ("cuda:00", "cuda:0"),
        ("cuda:+1", "cuda:1"),
        ("cuda: 1", "cuda:1"),
        ("cuda :1", "cuda:1"),
        ("CUDA:1", "cuda:1"),
        ("Cuda:1", "cuda:1"),
        (" cpu", "cpu"),
        ("cpu ", "cpu"),
        ("META", "meta"),
    ] {
        match text.parse::<Device>() {
            Err(DeviceError::Misspelled {
                text: written,
                canonical: meant,
            }) => {
                assert_eq!(
                    (written.as_str(), meant.to_string().as_str()),
                    (text, canonical)
                );
            }
            other => panic!("`{text}` read as {other:?}"),
        }
    }
    insta::assert_snapshot!("cuda:01".parse::<Device>().unwrap_err(), @r"
    `cuda:01` is not how a device is written: torch writes it `cuda:1`
    hint: write `cuda:1`: a kind in lowercase, then `:` and the index in decimal digits without a leading zero, no spaces
    ");
}

#[test]
fn an_index_of_zero_and_indices_with_a_zero_inside_are_read() {
    assert_eq!(device("cuda:0").index(), Some(0));
    assert_eq!(device("cuda:10").index(), Some(10));
    assert_eq!(device("xpu:100").index(), Some(100));
}

#[test]
fn an_unknown_kind_is_refused_with_the_kinds_there_are() {
    let error = "gpu:0".parse::<Device>().unwrap_err();
    insta::assert_snapshot!(error, @r"
    `gpu:0` is not a device: `gpu` is no kind of device
    hint: the kinds are `cpu`, `cuda`, `hip`, `xpu`, `mps`, `meta`, `xla`, `hpu`, `mtia`, `ipu`, `vulkan`
    ");
}

#[test]
fn a_bare_cuda_is_refused_with_a_hint_saying_why() {
    let error = "cuda".parse::<Device>().unwrap_err();
    assert!(matches!(
        error,
        DeviceError::NeedsIndex {
            kind: DeviceKind::Cuda,
            ..
        }
    ));
    insta::assert_snapshot!(error, @r"
    `cuda` does not say which cuda device
    hint: write `cuda:0`, `cuda:1`, …: a bare `cuda` means the thread's current device, and a branch runs on a thread lent to it
    ");
    assert!("xpu".parse::<Device>().is_err());
    assert!(Device::new(DeviceKind::Cuda, None).is_err());
}

#[test]
fn a_device_without_an_index_holds_what_is_on_any_of_its_kind() {
    assert!(device("mps").holds(device("mps:0")));
    assert!(device("cpu").holds(device("cpu")));
    assert!(device("cuda:1").holds(device("cuda:1")));
    assert!(!device("cuda:1").holds(device("cuda:0")));
    assert!(!device("cpu").holds(device("meta")));
}

proptest! {
    #[test]
    fn every_device_reads_back_from_what_it_shows(kind in 0..DeviceKind::ALL.len(), index in proptest::option::of(0_u32..1_000)) {
        let kind = DeviceKind::ALL[kind];
        if let Ok(device) = Device::new(kind, index) {
            prop_assert_eq!(device.to_string().parse::<Device>(), Ok(device));
        } else {
            prop_assert!(kind.needs_index() && index.is_none());
        }
    }

    #[test]
    fn reading_any_text_as_a_device_never_panics(text in ".{0,12}") {
        let _ = text.parse::<Device>();
    }
}

/// A node that answers its id and the device its ctx says, `id@device` or `id@-`.
struct Where;

impl Node for Where {
    fn forward(&self, _input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        let device = ctx
            .device()
            .map_or_else(|| "-".to_owned(), |d| d.to_string());
        Ok(Transition::Done(Value::text(format!(
            "{}@{device}",
            ctx.node()
        ))))
    }
}

fn the_n() -> (soma_core::Graph, Catalog) {
    // The N: a -> c, b -> c, b -> d.
    let mut graph = soma_core::Graph::new();
    let mut catalog = Catalog::new();
    for id in ["a", "b", "c", "d"] {
        graph.add_node(id).unwrap();
        catalog.insert(id, Arc::new(Where));
    }
    for (s, t) in [("a", "c"), ("b", "c"), ("b", "d")] {
        graph.add_edge(s, t).unwrap();
    }
    (graph, catalog)
}

#[test]
fn each_placed_node_is_told_its_device_and_the_others_none() {
    let (graph, catalog) = (node_arc("a", Arc::new(Where))
        >> (node_arc("b", Arc::new(Where)) | node_arc("c", Arc::new(Where))))
    .somatize()
    .unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let mut placement = Placement::new();
    placement.place("b", device("cuda:1"));
    placement.place("a", device("cpu"));
    placement.place("a", device("meta")); // Placing again replaces.
    let program = Program::with_placement(&plan, &catalog, &placement).unwrap();
    let out = Executor::new().run_program(&program, Value::Null).unwrap();
    let leaves = out.as_map().unwrap();
    assert_eq!(leaves[0].1, Value::text("b@cuda:1"));
    assert_eq!(leaves[1].1, Value::text("c@-"));
}

#[test]
fn placing_nodes_changes_neither_the_plan_nor_the_result() {
    let double =
        |x: &Value| -> Result<Value, NodeError> { Ok(Value::Int(x.as_int().unwrap() * 2)) };
    let (graph, catalog) = (node("a", double) >> (node("b", double) | node("c", double)))
        .somatize()
        .unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let mut placement = Placement::new();
    placement.place("a", device("cuda:0"));
    placement.place("c", device("cuda:1"));
    placement.place("ghost", device("cpu")); // Not in the plan: ignored.
    let placed = Program::with_placement(&plan, &catalog, &placement).unwrap();
    let unplaced = Program::new(&plan, &catalog).unwrap();
    assert_eq!(compile(&graph, &catalog).unwrap(), plan);
    let run = |program: &Program| Executor::new().run_program(program, Value::Int(1)).unwrap();
    assert_eq!(run(&placed), run(&unplaced));
}

#[test]
fn a_trace_records_each_nodes_device() {
    let (graph, catalog) = the_n();
    let plan = compile(&graph, &catalog).unwrap();
    let mut placement = Placement::new();
    placement.place("c", device("xpu:0"));
    let program = Program::with_placement(&plan, &catalog, &placement).unwrap();
    let trace = Arc::new(Trace::new());
    Executor::new()
        .with_trace(Arc::clone(&trace))
        .run_program(&program, Value::Null)
        .unwrap();
    let mut devices: Vec<(String, Option<Device>)> = trace
        .spans()
        .iter()
        .map(|s| (s.node.to_string(), s.device))
        .collect();
    devices.sort();
    let chrome = trace.to_chrome();
    assert_eq!(
        chrome.matches("\"device\":\"xpu:0\"").count(),
        1,
        "{chrome}"
    );
    assert_eq!(
        devices,
        vec![
            ("a".to_owned(), None),
            ("b".to_owned(), None),
            ("c".to_owned(), Some(device("xpu:0"))),
            ("d".to_owned(), None),
        ]
    );
}

#[test]
fn the_drawings_of_a_placed_plan_label_each_placed_node_with_its_device() {
    let (graph, catalog) = the_n();
    let plan = compile(&graph, &catalog).unwrap();
    let mut placement = Placement::new();
    placement.place("c", device("cuda:1"));
    insta::assert_snapshot!(plan.with_devices(&placement), @r"
    Sequence
    ├── a <- (input)
    ├── b <- (input)
    ├── c <- a, b @ cuda:1
    └── d <- b
    ");
    let mermaid = plan.with_devices(&placement).to_mermaid();
    assert!(mermaid.contains("c[\"c @ cuda:1\"]"), "{mermaid}");
    assert!(mermaid.contains("d[\"d\"]"), "{mermaid}");
    let dot = plan.with_devices(&placement).to_dot();
    assert!(dot.contains("\"c\" [label=\"c @ cuda:1\"];"), "{dot}");
    assert!(dot.contains("\"d\";"), "{dot}");
    let svg = plan.with_devices(&placement).to_svg();
    assert!(svg.contains(">c @ cuda:1</text>"), "{svg}");
    assert!(svg.contains(">d</text>"), "{svg}");
    // Unplaced, the drawings are the plan's own.
    let none = Placement::new();
    assert_eq!(plan.with_devices(&none).to_string(), plan.to_string());
    assert_eq!(plan.with_devices(&none).to_mermaid(), plan.to_mermaid());
    assert_eq!(plan.with_devices(&none).to_dot(), plan.to_dot());
    assert_eq!(plan.with_devices(&none).to_svg(), plan.to_svg());
}
