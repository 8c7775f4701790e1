import asyncio, dataclasses, time
import numpy as np
from vidchat import chat
from vidchat.chat import AnswerOptions
from vidchat.sessions import SessionRegistry
from tests.test_prewarm import entry_with_frames, add_audio

async def test_dbg(omni_engine):
    eng = omni_engine
    proc = getattr(eng._llm, "input_processor", None) or getattr(eng._llm, "processor", None)
    print("PROC", type(proc))
    registry = SessionRegistry()
    entry = entry_with_frames(registry, seed=21)
    add_audio(entry, 17.0, 99.0, seed=1)
    opts = AnswerOptions(max_tokens=2, temperature=0.0, include_audio=True)
    for form in ("seg", "one"):
        s = entry.session.sample()
        if form == "one": s = dataclasses.replace(s, audio_parts=())
        for k in range(4):
            p = chat.prepare(eng, entry, s, opts, (), f"Q{k}?")
            t0 = time.perf_counter()
            try:
                proc.process_inputs(f"x{form}{k}", p.prompt, p.params, arrival_time=time.time())
            except TypeError as e:
                print("sig", e); 
            t1 = time.perf_counter()
            r = eng.submit(p)
            async for _ in r: pass
            print("DBG", form, k, "process_inputs %.1f ms" % ((t1-t0)*1000), "ttft %.1f" % (r.stats.ttft_s*1000), r.stats.cached_tokens, r.stats.prompt_tokens)
