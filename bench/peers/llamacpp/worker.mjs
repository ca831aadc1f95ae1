// llama.cpp's side of bench/peers/llamacpp: node-llama-cpp's prebuilt CPU
// build, driven by JSON lines on stdin, one answer line on stdout each.
//
//   {"op":"load","path":F,"threads":2,"contextSize":N,"sequences":S,"kvType":T}
//     (T: the KV cache's ggml type, "F32" or "Q8_0", or "" for F16;
//     quantized values need flash attention, so Q8_0 turns it on)
//     (then a short untimed run on every sequence, so the first timed
//     decode does not pay for the context's first graphs)
//   {"op":"run","prompts":[[ids...]...],"n":[count...],"meta":bool,"spec":K}
//     → {"seconds":s,"ttft":[s...],"end":[s...],"tokens":[[ids...]...]}
//     with spec K > 0, each sequence guesses by prompt lookup:
//     node-llama-cpp's InputLookupTokenPredictor (the longest 3 to 5
//     token match of the sequence's last tokens in its prompt, up to K
//     tokens after it; at least 3: the predictor's predictionLength.max
//     is never below its patternLength.min), given the prompt as its
//     input tokens as LlamaCompletion does; the answer then also has
//     "predictions": per sequence its tokenPredictions ({used, unused,
//     validated, refuted}) and "predictionMax", the predictor's bound
//     with meta, also per sequence and step llama.cpp's runner-up token
//     and the gap between its best two logits (from the probabilities
//     node-llama-cpp returns: a softmax of the raw logits under the
//     greedy sampler, so ln(p1/p2) is the logit gap), and the tokens the
//     sequence holds at the end (its prompt, no BOS, and what it fed
//     back: the check that nothing was added); "near": per step its best
//     four tokens as [token, ln(p1/p)] (the logit gap to the best), so a
//     check can tell a three-way near tie from a disagreement.
//
// A run evaluates every prompt in its own sequence of the one context at
// once, greedy, each for exactly its count of tokens, so node-llama-cpp
// batches the sequences into shared llama_decode calls as its
// multi-sequence contexts do.
import {getLlama, InputLookupTokenPredictor} from "node-llama-cpp";
import readline from "node:readline";

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
let model = null, modelPath = "", context = null;

async function load(req) {
    if (context) await context.dispose();
    context = null;
    if (model && modelPath !== req.path) {
        await model.dispose();
        model = null;
    }
    if (!model) {
        model = await llama.loadModel({modelPath: req.path});
        modelPath = req.path;
    }
    const opts = {contextSize: req.contextSize, sequences: req.sequences, threads: req.threads};
    if (req.kvType) {
        opts.experimentalKvCacheKeyType = req.kvType;
        opts.experimentalKvCacheValueType = req.kvType;
        if (req.kvType !== "F32") opts.flashAttention = true;
    }
    context = await model.createContext(opts);
    // token ids valid in any vocabulary of 72 or more
    const warm = Array.from({length: req.sequences}, (_, i) => [10 + i, 20 + i, 30 + i, 40 + i]);
    await run({prompts: warm, n: warm.map(() => 2)});
    return {contextSize: context.contextSize, sequences: req.sequences, cpuMathCores: llama.cpuMathCores};
}

async function run(req) {
    const spec = req.spec ?? 0;
    const seqs = req.prompts.map((prompt) => {
        if (spec <= 0) return context.getSequence();
        const tokenPredictor = new InputLookupTokenPredictor({patternLength: {min: 3, max: 5}, predictionLength: {max: spec}});
        // sequence.evaluate gives the predictor no input tokens (only
        // LlamaChat and LlamaCompletion do): without them it guesses nothing.
        tokenPredictor.updateInputTokens(prompt);
        return context.getSequence({tokenPredictor});
    });
    const start = process.hrtime.bigint();
    const since = () => Number(process.hrtime.bigint() - start) / 1e9;
    const out = {ttft: [], end: [], tokens: []};
    try {
        await Promise.all(req.prompts.map(async (prompt, i) => {
            const toks = [];
            // yieldEogToken: an EOS is generated and fed back like any
            // token, as brokerd's IgnoreEOS does.
            const opts = {temperature: 0, yieldEogToken: true};
            if (req.n[i] > 0 && req.meta) {
                out.gaps ??= [];
                out.second ??= [];
                out.context ??= [];
                out.near ??= [];
                const gaps = [], second = [], near = [];
                for await (const r of seqs[i].evaluateWithMetadata(prompt, {probabilities: true}, opts)) {
                    if (toks.length === 0) out.ttft[i] = since();
                    toks.push(r.token);
                    let p1 = -1, p2 = -1, t1 = -1, t2 = -1;
                    for (const [tok, p] of r.probabilities) {
                        if (p > p1) [p2, t2, p1, t1] = [p1, t1, p, tok];
                        else if (p > p2) [p2, t2] = [p, tok];
                    }
                    if (t1 !== r.token) throw new Error(`greedy token ${r.token} is not the most probable ${t1}`);
                    gaps.push(p2 > 0 ? Math.log(p1 / p2) : 1e9);
                    second.push(t2);
                    const top = [...r.probabilities].filter(([, p]) => p > 0).sort((a, b) => b[1] - a[1]).slice(0, 4);
                    near.push(top.map(([tok, p]) => [tok, Math.log(p1 / p)]));
                    if (toks.length >= req.n[i]) break;
                }
                out.gaps[i] = gaps;
                out.second[i] = second;
                out.near[i] = near;
                out.context[i] = Array.from(seqs[i].contextTokens);
            } else if (req.n[i] > 0) {
                for await (const t of seqs[i].evaluate(prompt, opts)) {
                    if (toks.length === 0) out.ttft[i] = since();
                    toks.push(t);
                    if (toks.length >= req.n[i]) break;
                }
            }
            out.end[i] = since();
            out.tokens[i] = toks;
        }));
        out.seconds = since();
        if (spec > 0) {
            out.predictions = seqs.map((s) => ({...s.tokenPredictions}));
            out.predictionMax = seqs[0]?.tokenPredictor?.predictionMaxLength ?? 0;
        }
    } finally {
        for (const s of seqs) s.dispose();
    }
    return out;
}

const rl = readline.createInterface({input: process.stdin});
for await (const line of rl) {
    let ans;
    try {
        const req = JSON.parse(line);
        if (req.op === "load") ans = await load(req);
        else if (req.op === "run") ans = await run(req);
        else throw new Error(`unknown op ${req.op}`);
    } catch (e) {
        ans = {error: String(e?.stack ?? e)};
    }
    process.stdout.write(JSON.stringify(ans) + "\n");
}
if (context) await context.dispose();
if (model) await model.dispose();
