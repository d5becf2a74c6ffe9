"""The case matrix against fused backends (default: cuDNN and FLA), one test item per case x backend.

On a machine that cannot run a backend every item skips with that backend's reason, unless the pair is
required (NVTE_GDN2_TEST_REQUIRED=1, NVTE_GDN_TEST_REQUIRED=1, DELTACHECK_REQUIRE=backend:op), in which
case it fails. Select with the plugin's options, e.g.
``pytest tests/test_matrix.py --dc-backend fla --dc-op gdn2 -k thd -n 2``.
"""


def test_matrix(dc_task, dc_run):
    dc_run(dc_task)
