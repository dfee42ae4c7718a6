use clap::Parser;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc gives freed memory back to the system only when its threads allocate again after the
/// purge delay (1 s by default): a server that goes idle after a burst of big pushes kept the
/// burst's peak resident (BENCHMARKS.md, "Memory under big pushes"). With no delay it is given
/// back as it is freed, at no measurable cost to push latency. mimalloc reads its options from
/// the environment before `main`, and setting them in code needs `unsafe`, which this crate
/// forbids; so the process starts itself again, once, with the option set (an operator's own
/// value is kept).
const PURGE_DELAY: &str = "MIMALLOC_PURGE_DELAY";

fn with_allocator_options() {
    if std::env::var_os(PURGE_DELAY).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    // `exec` only returns on failure; the server then runs with mimalloc's defaults.
    let _ = std::os::unix::process::CommandExt::exec(
        std::process::Command::new(exe).args(args).env(PURGE_DELAY, "0"),
    );
}

fn main() {
    with_allocator_options();
    run();
}

#[actix_web::main]
async fn run() {
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
