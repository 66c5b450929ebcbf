//! The metaserver binary (placeholder until the server issue lands).

fn main() {
    println!("metaserver: not yet implemented");
}
