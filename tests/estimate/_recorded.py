"""Real trial figures recorded for the learned footprint's tests: params and peak RSS of trials run in
their own processes.

``TORCH_MLP_TRIALS``: (width, depth, batch_size, lr, peak MiB) of ``scripts/_learned_workloads.py``'s
``torch_mlp`` objective (five Adam steps, torch CPU 2.13, one thread), each run in a fresh interpreter and
measured by its ``ru_maxrss``; params drawn at random (width 64-3100 on a log scale, depth 2-4, batch 32-2048,
lr 1e-4 to 1e-2 on a log scale, seed 7) on a shared 2-core machine. The ~310 MiB of every trial is the
interpreter with torch and Optuna imported: a large constant baseline, as TensorFlow's in ``KERAS_TRIALS``.

``KERAS_TRIALS``: a Keras DQN's first 12 trials (bench_learned, 820 MiB budget): (maxlen, width, batch,
lr, peak MiB, censored). TensorFlow's ~650 MiB stays whatever the params; the trial at width 2014 was
stopped 118 MiB over its fit.
"""

TORCH_MLP_TRIALS = [
    (224, 2, 2048, 0.002004, 326.1),
    (84, 4, 32, 0.000539, 309.9),
    (80, 4, 128, 0.000119, 310.0),
    (344, 2, 128, 0.000152, 314.9),
    (332, 4, 32, 0.007851, 318.4),
    (740, 4, 32, 0.001426, 345.3),
    (298, 2, 32, 0.001298, 312.2),
    (107, 3, 128, 0.001206, 310.1),
    (586, 4, 128, 0.000161, 335.3),
    (587, 2, 512, 0.000157, 327.9),
    (1015, 4, 32, 0.00173, 388.6),
    (439, 4, 2048, 0.003585, 371.6),
    (390, 3, 512, 0.000398, 324.7),
    (1397, 4, 128, 0.000146, 449.3),
    (205, 3, 512, 0.002877, 317.3),
    (195, 2, 32, 0.001056, 310.6),
    (121, 3, 128, 0.007354, 310.5),
    (328, 4, 32, 0.003382, 317.5),
    (591, 3, 512, 0.002458, 333.2),
    (642, 4, 2048, 0.000137, 404.3),
    (92, 3, 2048, 0.002478, 320.0),
    (82, 4, 512, 0.001969, 312.8),
    (3022, 3, 512, 0.002712, 756.4),
    (2002, 3, 32, 0.007608, 485.2),
    (254, 4, 32, 0.000971, 314.2),
    (149, 3, 128, 0.002997, 311.5),
    (299, 3, 32, 0.000215, 314.8),
    (304, 3, 128, 0.004351, 315.8),
    (1830, 3, 2048, 0.009396, 478.7),
    (905, 3, 128, 0.0002, 358.1),
    (126, 2, 128, 0.000106, 310.1),
    (1611, 2, 512, 0.000366, 406.1),
    (112, 4, 512, 0.001658, 312.5),
    (220, 2, 32, 0.000819, 311.1),
    (1881, 4, 2048, 0.000625, 543.4),
    (295, 3, 2048, 0.000133, 355.5),
    (83, 2, 2048, 0.000211, 318.4),
    (239, 2, 32, 0.0001, 311.5),
    (115, 2, 512, 0.001688, 311.9),
]

KERAS_TRIALS = [
    (8557, 3370, 256, 0.0061, 820.0, True),
    (43374, 534, 256, 0.00015, 658.1, False),
    (1082, 6468, 128, 0.0036, 850.8, True),
    (1588, 2218, 64, 0.0035, 829.3, True),
    (5955, 1492, 512, 0.0023, 767.8, False),
    (4080, 719, 32, 0.00018, 686.4, False),
    (3434, 479, 128, 0.00021, 677.5, False),
    (12869, 259, 512, 0.00019, 676.8, False),
    (1179, 65, 512, 0.00076, 668.8, False),
    (1000, 2014, 512, 0.00023, 833.5, True),
    (1558, 64, 256, 0.0001, 668.0, False),
    (1301, 64, 256, 0.00047, 668.1, False),
]
