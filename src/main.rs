use clap::Parser;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[actix_web::main]
async fn main() {
    let cli = synkronus::cli::Cli::parse();
    let config = match synkronus::config::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("synkronus: invalid configuration: {e}");
            std::process::exit(2);
        }
    };
    synkronus::telemetry::init(&config.log_level, config.log_format, &config.node_id);
    if let Err(e) = synkronus::cli::run(cli, config).await {
        eprintln!("synkronus: {e:#}");
        std::process::exit(1);
    }
}
