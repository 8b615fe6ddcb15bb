//! Builds `c/exit.c`: the calls into the interpreter that a thread ended by the exiting
//! interpreter survives (`src/exit.rs` says how they are used, the C file why they are C).

fn main() {
    println!("cargo:rerun-if-changed=c/exit.c");
    cc::Build::new()
        .file("c/exit.c")
        .flag("-fexceptions")
        .warnings(true)
        .extra_warnings(true)
        .compile("soma_exit");
}
