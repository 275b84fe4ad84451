# The digest file standing in for a folder's content, written here when it is missing (the
# folder is made by another rule in this run, or did not exist when the Snakefile was read);
# digest_of keeps it current afterwards (marble.workflow.digests). The input is named: the
# preflight gate adds its own to every job. It is ancient: a folder whose date moved (a copy,
# `dvc checkout`) must not rewrite an unchanged digest and so retrain what reads it.
rule folder_digest:
    input:
        folder=lambda wc: ancient(
            DIGEST_FOLDERS[f"{wf_digests.FOLDER_DIGEST_DIR}/{wc.digest}.tree"]
        ),
    output:
        f"{wf_digests.FOLDER_DIGEST_DIR}/{{digest}}.tree",
    log:
        "logs/digests/{digest}.log",
    conda:
        MARBLE_ENV
    shell:
        "python -m marble.workflow.digests folder {input.folder:q} --out {output:q} > {log:q} 2>&1"


localrules:
    folder_digest,
