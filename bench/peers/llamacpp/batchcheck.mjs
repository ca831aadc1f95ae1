// Does node-llama-cpp batch concurrent sequences into one decode? Four
// sequences generate together; if they are batched, their tokens arrive
// in groups at nearly the same moment, one group per decode step.
//   node batchcheck.mjs MODEL.gguf
import {getLlama} from "node-llama-cpp";

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: process.argv[2]});
const context = await model.createContext({contextSize: 256, sequences: 4, threads: 2});
const start = process.hrtime.bigint();
const times = [[], [], [], []];
await Promise.all([0, 1, 2, 3].map(async i => {
    const seq = context.getSequence();
    for await (const t of seq.evaluate([100 + i, 200 + i, 300 + i], {temperature: 0})) {
        times[i].push(Number(process.hrtime.bigint() - start) / 1e6);
        if (times[i].length >= 8) break;
    }
}));
for (let s = 0; s < 8; s++)
    console.log(`token ${s}: ` + times.map(t => t[s].toFixed(1) + " ms").join(", "));
await context.dispose();
await model.dispose();
