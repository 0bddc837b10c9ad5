fn main() {
    println!("cargo:rerun-if-changed=proto/cluster.proto");
}
