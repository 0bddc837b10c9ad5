//! Generation speed on one core: bytes of a 256 MiB generation written to a sink that
//! drops them, for generation 1 and a later generation, default model and pure model.
//! `docs/performance.md` ("Workload generator") quotes the medians.

use std::io::{self, Write};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use larder_gen::{Config, Model, Workload};

const SIZE: u64 = 256 << 20;

/// A sink that only touches the bytes' length, so the bench measures generation.
struct Discard;

impl Write for Discard {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(criterion::black_box(buf).len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("gen");
    group.throughput(Throughput::Bytes(SIZE));
    group.sample_size(10);
    for (name, model) in [("default", Model::default()), ("pure", Model::pure())] {
        let mut workload = Workload::new(Config {
            seed: 1,
            generation_size: SIZE,
            generations: 2,
            clients: 1,
            model,
        })
        .expect("valid config");
        let first = workload.next_generation().expect("generation 1");
        let second = workload.next_generation().expect("generation 2");
        group.bench_function(format!("{name}/generation-1"), |b| {
            b.iter(|| workload.write(&first, &mut Discard).expect("no I/O"))
        });
        group.bench_function(format!("{name}/generation-2"), |b| {
            b.iter(|| workload.write(&second, &mut Discard).expect("no I/O"))
        });
        group.bench_function(format!("{name}/plan"), |b| {
            b.iter(|| {
                let mut w = Workload::new(Config {
                    seed: 1,
                    generation_size: SIZE,
                    generations: 2,
                    clients: 1,
                    model: workload.config().model.clone(),
                })
                .expect("valid config");
                (w.next_generation(), w.next_generation())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
