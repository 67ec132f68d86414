"""Run Google's ``create_pretraining_data.py`` (TF1 code) under TensorFlow 2, unchanged.

The peer is *run*, never shipped: pass the path of a checkout of google-research/bert
(e.g. brought by ``git clone https://github.com/google-research/bert``). This wrapper only
aliases ``tensorflow`` to ``tensorflow.compat.v1`` (tf.flags, tf.gfile, tf.python_io,
tf.logging) and then executes the script as ``__main__`` with the remaining arguments.
``absl.flags`` needs the real ``sys.argv``, so the script path is dropped from it first.

    python bench/google_peer.py /path/to/bert/create_pretraining_data.py --input_file=... --output_file=...
"""

import os
import runpy
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    if len(sys.argv) < 2 or not os.path.isfile(sys.argv[1]):
        raise SystemExit("usage: google_peer.py PATH/TO/create_pretraining_data.py [flags...]")
    script = os.path.abspath(sys.argv[1])
    import tensorflow.compat.v1 as tf1

    sys.modules["tensorflow"] = tf1  # `import tensorflow as tf` in the peer gets the v1 API
    sys.path.insert(0, os.path.dirname(script))  # its `import tokenization`
    sys.argv = [script] + sys.argv[2:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
