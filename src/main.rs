use clap::Parser;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[actix_web::main]
async fn main() {
    let status = synkronus::cli::run(synkronus::cli::Cli::parse()).await;
    if status != 0 {
        std::process::exit(status);
    }
}
