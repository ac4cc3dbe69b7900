//! Prints the API's OpenAPI spec (JSON), generated from the server's code:
//! `cargo run -p pagefold-api --example openapi > api/openapi.json`.

fn main() {
    match pagefold_api::spec::json() {
        Ok(y) => print!("{y}"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
