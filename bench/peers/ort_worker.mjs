// ONNX Runtime side of the encoder peer benchmark: loads the exported
// encoder with onnxruntime-node (the intra-op threads given) and answers
// one JSON command per stdin line on stdout:
//   {"cmd":"run","ids":[[...],...]}            -> {"out":[[...],...]}
//   {"cmd":"time","ids":[[...],...],"seconds":S} -> {"iters":N,"seconds":T}
// Every row of a batch has the same length here (the benchmark's shapes),
// so no padding and an all-ones attention mask.
import * as readline from 'node:readline';
import ort from 'onnxruntime-node';

const [model, threads] = process.argv.slice(2);
const session = await ort.InferenceSession.create(model, {
  intraOpNumThreads: Number(threads || 2), interOpNumThreads: 1, executionMode: 'sequential',
  graphOptimizationLevel: 'all',
});

function feeds(ids) {
  const b = ids.length, s = ids[0].length;
  const flat = BigInt64Array.from(ids.flat(), (x) => BigInt(x));
  return {
    input_ids: new ort.Tensor('int64', flat, [b, s]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(b * s).fill(1n), [b, s]),
    token_type_ids: new ort.Tensor('int64', new BigInt64Array(b * s), [b, s]),
  };
}

const rl = readline.createInterface({ input: process.stdin });
for await (const line of rl) {
  const cmd = JSON.parse(line);
  const f = feeds(cmd.ids);
  if (cmd.cmd === 'run') {
    const r = await session.run(f);
    const e = r.embedding, dim = e.dims[1], out = [];
    for (let i = 0; i < e.dims[0]; i++) out.push(Array.from(e.data.subarray(i * dim, (i + 1) * dim)));
    process.stdout.write(JSON.stringify({ out }) + '\n');
  } else if (cmd.cmd === 'time') {
    await session.run(f); // warm-up: this shape's kernels
    let iters = 0;
    const start = process.hrtime.bigint();
    let elapsed = 0;
    while (elapsed < cmd.seconds) {
      await session.run(f);
      iters++;
      elapsed = Number(process.hrtime.bigint() - start) / 1e9;
    }
    process.stdout.write(JSON.stringify({ iters, seconds: elapsed }) + '\n');
  }
}
